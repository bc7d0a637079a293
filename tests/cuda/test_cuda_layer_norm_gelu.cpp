// CUDA layer_norm and gelu(approximate='tanh') against the CPU ops on the same fresh inputs:
// rows 1..37 and more, widths around every switch of the CUDA kernels (4 lanes up to 16
// values, a warp up to 1024, a block beyond; column tiles of 1..32), one and two
// normalised dims, with and without weight and bias, contiguous and non-contiguous
// inputs, forward and gradients through autograd, float32 and float64; outputs poisoned
// before the kernels write them; and run-to-run determinism.
//
// Tolerances:
// - layer_norm: both devices sum in float64 in different orders, and share every formula
//   after the sums (kernels/layer_norm_math.h). The sums differ in the last bits, which a
//   float32 rounding of mean, rstd or a gradient may turn into one float32 ulp. Compared by
//   normalised error, |gpu - cpu| <= tol * max|cpu|: 1e-5 for float32 and 1e-12 for
//   float64 (tolerance::batch_norm_normalised, whose argument is the same).
// - gelu tanh: CUDA's tanhf / tanh against glibc's (tolerance::transcendental).
// - Determinism: two runs on the GPU give the same bits (no atomics anywhere).
#include "cuda_test_util.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "cuda_tolerances.h"
#include "kernels/layer_norm.h"
#include "kernels/layer_norm_kernels.h"

using namespace weft;
using test::gpu;
using test::on_gpu;
using test::poisoned;
using test::random;
namespace tolerance = test::tolerance;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double layer_norm_tol(DType dtype) { return tolerance::batch_norm_normalised(dtype); }

struct LayerNormConfig {
  Shape input, normalized;
  DType dtype;
  bool weight, bias;   // whether they are given
  bool need_x;         // whether x requires grad (weight and bias do whenever given)
  bool noncontiguous;  // x's layout on both devices
};

// y and the gradients of sum(y * upstream) (undefined where not asked for), on `device`.
std::vector<Tensor> run_layer_norm(const LayerNormConfig& c, const std::vector<Tensor>& values, Device device) {
  // Fresh leaves on both devices (to(kCPU) of a CPU tensor may hand back the same one).
  Tensor x = values[0].detach().to(device);
  if (c.noncontiguous) x = test::noncontiguous(x);
  x.requires_grad_(c.need_x);
  Tensor w = c.weight ? values[1].detach().to(device).requires_grad_() : Tensor();
  Tensor b = c.bias ? values[2].detach().to(device).requires_grad_() : Tensor();
  Tensor y = layer_norm(x, c.normalized, w, b, 1e-5);
  std::vector<Tensor> out{y.detach()};
  if (c.need_x || c.weight || c.bias) {
    sum(mul(y, values[3].to(device))).backward();
    for (const Tensor& t : {x, w, b}) out.push_back(t.defined() && t.requires_grad() ? t.grad() : Tensor());
  }
  return out;
}

void check_layer_norm(const LayerNormConfig& c, uint64_t seed) {
  CAPTURE(c.input);
  CAPTURE(c.normalized);
  CAPTURE(dtype_name(c.dtype));
  CAPTURE(c.weight);
  CAPTURE(c.bias);
  CAPTURE(c.need_x);
  CAPTURE(c.noncontiguous);
  // An offset mean, so that centring matters.
  const std::vector<Tensor> values{add(random(c.input, c.dtype, seed), 0.5), random(c.normalized, c.dtype, seed + 1),
                                   random(c.normalized, c.dtype, seed + 2), random(c.input, c.dtype, seed + 3)};
  const std::vector<Tensor> cpu = run_layer_norm(c, values, kCPU);
  const std::vector<Tensor> cuda = run_layer_norm(c, values, gpu());
  REQUIRE(cuda[0].device() == gpu());
  REQUIRE(cpu.size() == cuda.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i);  // 0: y; 1, 2, 3: the gradients of x, weight, bias
    REQUIRE(cpu[i].defined() == cuda[i].defined());
    if (cpu[i].defined()) CHECK_NORMALISED_WITHIN(cuda[i], cpu[i], layer_norm_tol(c.dtype));
  }
}

}  // namespace

TEST_CASE("layer_norm: forward and gradients match the CPU over rows and widths") {
  uint64_t seed = 100;
  int config = 0;
  for (DType dtype : {DType::Float32, DType::Float64})
    for (int64_t n : {1, 3, 16, 17, 32, 127, 769, 1024, 1025, 4097})
      for (int64_t rows : {1, 2, 5, 31, 37}) {
        // Weight and bias both, neither, or one of them, in turn.
        const bool weight = config % 4 < 2, bias = config % 2 == 0;
        ++config;
        check_layer_norm({{rows, n}, {n}, dtype, weight, bias, true, false}, seed += 10);
        // The same with x non-contiguous, and with only the parameters requiring grad.
        check_layer_norm({{rows, n}, {n}, dtype, true, true, true, true}, seed += 10);
        check_layer_norm({{rows, n}, {n}, dtype, true, true, false, false}, seed += 10);
      }
}

TEST_CASE("layer_norm: batched inputs, two normalised dims, many rows") {
  uint64_t seed = 5000;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    check_layer_norm({{4, 9, 768}, {768}, dtype, true, true, true, true}, seed += 10);
    check_layer_norm({{3, 5, 7, 6}, {7, 6}, dtype, true, true, true, false}, seed += 10);
    check_layer_norm({{3, 5, 7, 6}, {7, 6}, dtype, false, false, true, true}, seed += 10);
    check_layer_norm({{2, 33, 129}, {33, 129}, dtype, true, false, true, false}, seed += 10);
    // Many rows: several column chunks, grid-stride loops over row groups.
    check_layer_norm({{4099, 3}, {3}, dtype, true, true, true, false}, seed += 10);
    check_layer_norm({{20001, 40}, {40}, dtype, true, true, true, false}, seed += 10);
    check_layer_norm({{2048, 769}, {769}, dtype, true, true, true, false}, seed += 10);
  }
  // GPT-2 small's shape: 8 sequences of 1024 tokens, 768 channels.
  check_layer_norm({{8, 1024, 768}, {768}, DType::Float32, true, true, true, false}, seed += 10);
}

TEST_CASE("layer_norm: empty inputs and a constant row") {
  for (Device d : {kCPU, gpu()}) {
    Tensor x = zeros({0, 5}, TensorOptions(DType::Float32, d)).requires_grad_();
    Tensor w = ones({5}, TensorOptions(DType::Float32, d)).requires_grad_();
    Tensor y = layer_norm(x, {5}, w);
    CHECK(y.shape() == Shape{0, 5});
    sum(y).backward();
    CHECK(w.grad().to(kCPU).to_vector<float>() == std::vector<float>(5, 0.0f));
  }
  // A constant row gives 0 (eps > 0), or 0 / 0 = NaN with eps = 0, on both devices.
  for (double eps : {1e-5, 0.0}) {
    Tensor x = full({3, 70}, 2.5, DType::Float64);
    CHECK_WITHIN(layer_norm(on_gpu(x), {70}, Tensor(), Tensor(), eps), layer_norm(x, {70}, Tensor(), Tensor(), eps),
                 (tolerance::Tol{0, 0}));
  }
}

TEST_CASE("layer_norm kernels overwrite poisoned outputs") {
  uint64_t seed = 7000;
  for (DType dtype : {DType::Float32, DType::Float64})
    for (int64_t n : {1, 3, 40, 769, 4097})
      for (int64_t rows : {1, 37}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(n);
        CAPTURE(rows);
        const TensorOptions cpu_opts(dtype, kCPU);
        Tensor x = random({rows, n}, dtype, ++seed), w = random({n}, dtype, ++seed), b = random({n}, dtype, ++seed);
        Tensor g = random({rows, n}, dtype, ++seed);
        Tensor y = empty({rows, n}, cpu_opts), mean = empty({rows}, cpu_opts), rstd = empty({rows}, cpu_opts);
        layer_norm_forward_stub(kCPU, x, w, b, 1e-5, y, mean, rstd);
        Tensor y_gpu = poisoned({rows, n}, dtype, gpu()), mean_gpu = poisoned({rows}, dtype, gpu());
        Tensor rstd_gpu = poisoned({rows}, dtype, gpu());
        layer_norm_forward_stub(gpu(), on_gpu(x), on_gpu(w), on_gpu(b), 1e-5, y_gpu, mean_gpu, rstd_gpu);
        const double tol = layer_norm_tol(dtype);
        CHECK_NORMALISED_WITHIN(y_gpu, y, tol);
        CHECK_NORMALISED_WITHIN(mean_gpu, mean, tol);
        CHECK_NORMALISED_WITHIN(rstd_gpu, rstd, tol);
        for (bool with_weight : {true, false}) {
          CAPTURE(with_weight);
          const Tensor weight = with_weight ? w : Tensor();
          Tensor gx = empty({rows, n}, cpu_opts), gw = empty({n}, cpu_opts), gb = empty({n}, cpu_opts);
          layer_norm_backward_stub(kCPU, g, x, mean, rstd, weight, gx, gw, gb);
          Tensor gx_gpu = poisoned({rows, n}, dtype, gpu()), gw_gpu = poisoned({n}, dtype, gpu());
          Tensor gb_gpu = poisoned({n}, dtype, gpu());
          layer_norm_backward_stub(gpu(), on_gpu(g), on_gpu(x), on_gpu(mean), on_gpu(rstd),
                                   with_weight ? on_gpu(w) : Tensor(), gx_gpu, gw_gpu, gb_gpu);
          CHECK_NORMALISED_WITHIN(gx_gpu, gx, tol);
          CHECK_NORMALISED_WITHIN(gw_gpu, gw, tol);
          CHECK_NORMALISED_WITHIN(gb_gpu, gb, tol);
          // Each output on its own: the others undefined (skipped).
          Tensor only_gw = poisoned({n}, dtype, gpu());
          layer_norm_backward_stub(gpu(), on_gpu(g), on_gpu(x), on_gpu(mean), on_gpu(rstd), Tensor(), Tensor(),
                                   only_gw, Tensor());
          CHECK_NORMALISED_WITHIN(only_gw, gw, tol);
          Tensor only_gx = poisoned({rows, n}, dtype, gpu());
          layer_norm_backward_stub(gpu(), on_gpu(g), on_gpu(x), on_gpu(mean), on_gpu(rstd),
                                   with_weight ? on_gpu(w) : Tensor(), only_gx, Tensor(), Tensor());
          CHECK_NORMALISED_WITHIN(only_gx, gx, tol);
        }
      }
}

TEST_CASE("layer_norm is deterministic on the GPU") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const LayerNormConfig c{{3000, 1025}, {1025}, dtype, true, true, true, false};
    const std::vector<Tensor> values{random(c.input, dtype, 1), random({1025}, dtype, 2), random({1025}, dtype, 3),
                                     random(c.input, dtype, 4)};
    const std::vector<Tensor> first = run_layer_norm(c, values, gpu());
    const std::vector<Tensor> second = run_layer_norm(c, values, gpu());
    for (size_t i = 0; i < first.size(); ++i) CHECK_IDENTICAL(second[i], first[i]);
  }
}

TEST_CASE("layer_norm: device mismatch is an error") {
  Tensor x = on_gpu(random({2, 4}, DType::Float32, 1));
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, random({4}, DType::Float32, 2)),
                       doctest::Contains("layer_norm: weight is on cpu"), Error);
}

TEST_CASE("gelu tanh: forward and backward match the CPU") {
  uint64_t seed = 9000;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const tolerance::Tol tol = tolerance::transcendental(dtype);
    for (const Shape& shape : std::vector<Shape>{{}, {1}, {7}, {100003}, {33, 65}, {0, 4}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(shape);
      Tensor x = mul(random(shape, dtype, ++seed), 3.0), g = random(shape, dtype, ++seed);
      CHECK_WITHIN(gelu(on_gpu(x), GeluApproximate::Tanh), gelu(x, GeluApproximate::Tanh), tol);
      CHECK_WITHIN(gelu_backward(on_gpu(g), on_gpu(x), GeluApproximate::Tanh),
                   gelu_backward(g, x, GeluApproximate::Tanh), tol);
      // Through autograd, with x non-contiguous on both devices.
      if (shape.size() == 2) {
        Tensor xc = test::noncontiguous(x).requires_grad_(), xg = test::noncontiguous(on_gpu(x)).requires_grad_();
        Tensor yc = gelu(xc, GeluApproximate::Tanh), yg = gelu(xg, GeluApproximate::Tanh);
        CHECK_WITHIN(yg, yc, tol);
        sum(mul(yc, g)).backward();
        sum(mul(yg, on_gpu(g))).backward();
        CHECK_WITHIN(xg.grad(), xc.grad(), tol);
        // A broadcast gradient takes the indexed path.
        Tensor row = g.select(0, 0);
        CHECK_WITHIN(gelu_backward(on_gpu(row), on_gpu(x), GeluApproximate::Tanh),
                     gelu_backward(row, x, GeluApproximate::Tanh), tol);
      }
    }
    // Special values: inf stays inf, -inf gives NaN (-inf * 0), NaN stays NaN, on both.
    Tensor special = tensor(std::vector<double>{kNaN, kInf, -kInf, 0.0, 1e30, -1e30, 30.0, -30.0}).to(dtype);
    CHECK_WITHIN(gelu(on_gpu(special), GeluApproximate::Tanh), gelu(special, GeluApproximate::Tanh), tol);
  }
}
