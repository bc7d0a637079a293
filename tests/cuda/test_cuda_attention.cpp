// CUDA scaled_dot_product_attention against the CPU on the same fresh inputs: the kernels
// called directly on poisoned outputs (every element of out, lse and the gradients must be
// written), then the op through autograd on seeded random shapes (odd sizes, head dims across
// the kernels' 32 / 64-column chunks, L != S, causal or not, q, k, v as non-contiguous views
// of one [B, T, 3, H, D] tensor), the dropout path, empty shapes, and run-to-run determinism.
//
// Tolerances: both devices sum the same products in another order (the CPU in Eigen's
// blocks, the GPU in 32-key tiles with fused multiply-adds), with float64 row sums and exp in
// the input's precision on both; outputs and gradients are compared by normalised error,
// |gpu - cpu| <= tol * max(max|cpu|, 1), with the matmul table's tol (2e-5 float32, 1e-12
// float64; cuda_tolerances.h). The floor of 1 covers a gradient that cancels to 0 (grad_q
// with a single key) but whose terms are O(1). The same seed on the GPU repeats bit for bit.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "cuda_tolerances.h"
#include "kernels/attention.h"
#include "kernels/attention_kernels.h"

using namespace weft;
using test::gpu;
using test::poisoned;
using test::random;
namespace tolerance = test::tolerance;

namespace {

// |actual - expected| <= tol * max(max|expected|, 1) everywhere (NaN never passes).
#define CHECK_ATTENTION_CLOSE(actual, expected, dtype)                                                     \
  do {                                                                                                    \
    const ::weft::Tensor weft_expected_ = (expected);                                                     \
    const double weft_atol_ =                                                                             \
        tolerance::matmul_normalised(dtype) * std::max(::weft::test::max_abs(weft_expected_), 1.0);       \
    const std::string weft_difference_ = ::weft::test::difference((actual), weft_expected_, weft_atol_, 0.0); \
    CHECK_MESSAGE(weft_difference_.empty(), weft_difference_);                                            \
  } while (0)

struct Config {
  int64_t B, H, L, S, E, Ev;
  bool causal;
  bool strided;  // q, k, v as views of [B, T, 3, H, D] (needs L == S and E == Ev)
  std::string str() const {
    std::ostringstream out;
    out << "B " << B << " H " << H << " L " << L << " S " << S << " E " << E << " Ev " << Ev
        << (causal ? " causal" : "") << (strided ? " strided" : "");
    return out.str();
  }
};

struct Inputs {
  Tensor q, k, v;
};

// Fresh float64 values for a configuration, in its layout, converted to dtype, on `device`:
// the same values for the same seed on every device.
Inputs make_inputs(const Config& c, DType dtype, uint64_t seed, Device device) {
  auto fresh = [&](const Shape& shape, uint64_t s) { return random(shape, DType::Float64, s).to(device, dtype); };
  if (c.strided) {
    Tensor qkv = fresh({c.B, c.L, 3, c.H, c.E}, seed);
    return {qkv.select(2, 0).transpose(1, 2), qkv.select(2, 1).transpose(1, 2), qkv.select(2, 2).transpose(1, 2)};
  }
  return {fresh({c.B, c.H, c.L, c.E}, seed), fresh({c.B, c.H, c.S, c.E}, seed + 1),
          fresh({c.B, c.H, c.S, c.Ev}, seed + 2)};
}

struct Result {
  Tensor out, dq, dk, dv;
};

// The op on the inputs' device and in their layout (leaves that share their storage), with
// the gradients of sum(out * w) for w fresh from `weight_seed`.
Result run(const Inputs& in, bool causal, uint64_t weight_seed, double dropout_p = 0, Generator* gen = nullptr,
           bool math = false) {
  Tensor q = in.q.detach().requires_grad_(), k = in.k.detach().requires_grad_(), v = in.v.detach().requires_grad_();
  Result r;
  r.out = math ? scaled_dot_product_attention_math(q, k, v, causal, dropout_p, std::nullopt, gen)
               : scaled_dot_product_attention(q, k, v, causal, dropout_p, std::nullopt, gen);
  Tensor w = random(r.out.shape(), DType::Float64, weight_seed).to(r.out.device(), r.out.dtype());
  sum(mul(r.out, w)).backward();
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  return r;
}

void check_same_result(const Result& cuda, const Result& cpu, DType dtype) {
  REQUIRE(cuda.out.device() == gpu());
  CHECK_ATTENTION_CLOSE(cuda.out, cpu.out, dtype);
  CHECK_ATTENTION_CLOSE(cuda.dq, cpu.dq, dtype);
  CHECK_ATTENTION_CLOSE(cuda.dk, cpu.dk, dtype);
  CHECK_ATTENTION_CLOSE(cuda.dv, cpu.dv, dtype);
}

// Head dims at and around the kernels' chunk widths (32 in float64, 64 in float32).
const std::vector<Config> kEdges = {
    {1, 1, 1, 1, 1, 1, false, false},      {1, 1, 1, 1, 1, 1, true, false},
    {1, 2, 32, 32, 32, 32, true, false},   {1, 2, 33, 31, 33, 31, true, false},
    {2, 1, 64, 64, 64, 64, true, false},   {1, 1, 65, 97, 65, 63, false, false},
    {1, 1, 40, 70, 128, 129, true, false}, {1, 1, 70, 40, 130, 3, true, false},
    {1, 1, 200, 1, 5, 7, true, false},     {1, 1, 1, 200, 7, 5, false, false},
    {2, 3, 96, 96, 16, 16, true, true},    {4, 4, 256, 256, 64, 64, true, true},
};

}  // namespace

TEST_CASE("attention kernels write every element of out, lse and the gradients") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const Config& c : kEdges) {
      CAPTURE(dtype);
      CAPTURE(c.str());
      const int64_t bh = c.B * c.H;
      const Tensor q = random({bh, c.L, c.E}, dtype, 1), k = random({bh, c.S, c.E}, dtype, 2);
      const Tensor v = random({bh, c.S, c.Ev}, dtype, 3), g = random({bh, c.L, c.Ev}, dtype, 4);
      const double scale = 0.3;
      Tensor out = empty({bh, c.L, c.Ev}, dtype), lse = empty({bh, c.L}, dtype), delta = empty({bh, c.L}, dtype);
      Tensor dq = empty(q.shape(), dtype), dk = empty(k.shape(), dtype), dv = empty(v.shape(), dtype);
      attention_forward_stub(kCPU, q, k, v, out, lse, scale, c.causal);
      attention_backward_stub(kCPU, g, q, k, v, out, lse, delta, dq, dk, dv, scale, c.causal);

      auto nan_like = [&](const Tensor& t) { return poisoned(t.shape(), dtype, gpu()); };
      Tensor out_d = nan_like(out), lse_d = nan_like(lse), delta_d = nan_like(delta);
      Tensor dq_d = nan_like(dq), dk_d = nan_like(dk), dv_d = nan_like(dv);
      const Tensor qd = q.to(gpu()), kd = k.to(gpu()), vd = v.to(gpu()), gd = g.to(gpu());
      attention_forward_stub(gpu(), qd, kd, vd, out_d, lse_d, scale, c.causal);
      // The backward reads the CPU's out and lse, so that its check does not inherit the forward's differences.
      attention_backward_stub(gpu(), gd, qd, kd, vd, out.to(gpu()), lse.to(gpu()), delta_d, dq_d, dk_d, dv_d, scale,
                              c.causal);
      CHECK_ATTENTION_CLOSE(out_d, out, dtype);
      CHECK_ATTENTION_CLOSE(lse_d, lse, dtype);
      CHECK_ATTENTION_CLOSE(delta_d, delta, dtype);
      CHECK_ATTENTION_CLOSE(dq_d, dq, dtype);
      CHECK_ATTENTION_CLOSE(dk_d, dk, dtype);
      CHECK_ATTENTION_CLOSE(dv_d, dv, dtype);
    }
  }
}

TEST_CASE("attention: CUDA matches the CPU on edge and seeded random shapes, forward and backward") {
  std::vector<Config> configs = kEdges;
  // Draws by modulo (the distributions of <random> differ between standard libraries).
  std::mt19937_64 engine(2024);
  auto in = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(engine() % uint64_t(hi - lo + 1)); };
  for (int i = 0; i < 16; ++i) {
    Config c{in(1, 3), in(1, 3), in(1, 150), in(1, 150), in(1, 140), in(1, 140), in(0, 1) == 1, in(0, 3) == 0};
    if (c.strided) {
      c.S = c.L;
      c.Ev = c.E;
    }
    configs.push_back(c);
  }
  uint64_t seed = 10;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const Config& c : configs) {
      CAPTURE(dtype);
      CAPTURE(c.str());
      const Inputs gpu_inputs = make_inputs(c, dtype, seed, gpu()), cpu_inputs = make_inputs(c, dtype, seed, kCPU);
      seed += 3;
      check_same_result(run(gpu_inputs, c.causal, seed), run(cpu_inputs, c.causal, seed), dtype);
    }
  }
}

TEST_CASE("attention: CUDA repeats bit for bit") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Config c{2, 3, 150, 150, 72, 72, true, true};
    const Inputs inputs = make_inputs(c, dtype, 77, gpu());
    const Result a = run(inputs, true, 78), b = run(inputs, true, 78);
    CHECK_IDENTICAL(a.out, b.out);
    CHECK_IDENTICAL(a.dq, b.dq);
    CHECK_IDENTICAL(a.dk, b.dk);
    CHECK_IDENTICAL(a.dv, b.dv);
  }
}

TEST_CASE("attention on CUDA: the dropout path, the reference path and empty shapes") {
  const Inputs inputs = make_inputs({2, 2, 40, 50, 8, 12, true, false}, DType::Float64, 90, gpu());
  Generator g1(5), g2(5);
  const Result fused = run(inputs, true, 91, 0.25, &g1);
  const Result math = run(inputs, true, 91, 0.25, &g2, /*math=*/true);
  CHECK_IDENTICAL(fused.out, math.out);
  CHECK_IDENTICAL(fused.dq, math.dq);
  // The reference path on CUDA (cuBLAS, softmax) against the fused kernels.
  check_same_result(run(inputs, true, 92, 0, nullptr, /*math=*/true), run(inputs, true, 92), DType::Float64);

  const Inputs no_keys{random({2, 3, 4}).to(gpu()), random({2, 0, 4}).to(gpu()), random({2, 0, 5}).to(gpu())};
  const Result r = run(no_keys, false, 93);
  CHECK(r.out.shape() == Shape{2, 3, 5});
  CHECK(test::max_abs(r.out) == 0);
  CHECK(test::max_abs(r.dq) == 0);
}
