// CUDA matmul (cuBLAS), conv2d (cuDNN), pooling and batch norm against the CPU ops on the
// same fresh inputs: odd, batched, broadcast and empty shapes, transposed / strided /
// non-contiguous operands, every convolution knob, gradients through autograd, outputs
// poisoned before the kernels write them, and run-to-run determinism.
//
// Tolerances (stated once, used throughout):
// - Matrix products and convolutions sum in another order than the CPU (cuBLAS and cuDNN
//   block their reductions; cuDNN may use FFT or Winograd transforms). They are compared
//   by normalised error: |gpu - cpu| <= tol * max|cpu| for every element, with tol 2e-5
//   for float32 matmul, 5e-5 for float32 conv and 1e-12 for float64. cuDNN's timed choice
//   (the default) gets 4e-4 in float32: its Winograd and FFT algorithms round more than a
//   plain sum: WINOGRAD_NONFUSED, which cuDNN times fastest for a ConvNet's 5x5 layers'
//   backward passes on an H200 (cuDNN 9.14), is off by up to 1.7e-4 of the scale
//   (WEFT_CONV_LOG=1 names each choice). TF32 (10-bit mantissa) would be off by about 3e-4
//   on these sizes (simulated), so it is the 5e-5 bound of cuDNN's heuristic choice in
//   deterministic mode that checks TF32 stays off in conv2d unless allowed (the math rules
//   are the same in both modes), as matmul's 2e-5 does for cuBLAS.
// - Pooling: each output is computed as on the CPU, in the same order, so results, indices
//   and gradients equal the CPU's bit for bit (NaN matching NaN).
// - Batch norm: the statistics and gradient sums are float64 on both devices, in another
//   order: normalised tol 1e-5 for float32 (one float32 rounding of the per-channel
//   constants on either side) and 1e-12 for float64.
// - Determinism: two runs on the GPU give the same bits.
#include "cuda_test_util.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/determinism.h"
#include "kernels/batch_norm_kernels.h"
#include "kernels/conv_kernels.h"
#include "kernels/cuda/direct_conv.h"
#include "kernels/cuda/runtime.h"
#include "kernels/linalg_kernels.h"
#include "kernels/pooling_kernels.h"

using namespace weft;
using test::gpu;
using test::on_gpu;
using test::poisoned;
using test::random;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double tol_of(DType dtype) { return dtype == DType::Float32 ? 2e-5 : 1e-12; }
double conv_tol_of(DType dtype) { return dtype == DType::Float32 ? 5e-5 : 1e-12; }
double timed_conv_tol_of(DType dtype) { return dtype == DType::Float32 ? 4e-4 : 1e-12; }
double bn_tol_of(DType dtype) { return dtype == DType::Float32 ? 1e-5 : 1e-12; }

// |gpu - cpu| <= tol * max|cpu| everywhere (an all-zero reference asks for zeros).
#define CHECK_NORMALISED(gpu_tensor, cpu_tensor, tol)                                          \
  do {                                                                                         \
    const ::weft::Tensor weft_expected_ = (cpu_tensor);                                        \
    CHECK_GPU_MATCHES((gpu_tensor), weft_expected_, (tol) * ::weft::test::max_abs(weft_expected_) + 1e-300, 0.0); \
  } while (0)

// Differentiable non-contiguous views of t's values (test::noncontiguous detaches).
// stepped: the last dim has stride 2. transposed: dims 0 and -1 swapped in memory, which
// makes a matrix column-major (cuBLAS's op T) and a batch of them fit neither layout.
Tensor stepped(const Tensor& t) {
  if (t.dim() == 0) return t;
  Shape pairs = t.shape();
  pairs.push_back(2);
  return t.unsqueeze(-1).expand(pairs).contiguous().select(-1, 0);
}

Tensor transposed(const Tensor& t) {
  if (t.dim() < 2) return stepped(t);
  return t.transpose(0, t.dim() - 1).contiguous().transpose(0, t.dim() - 1);
}

using Layout = std::function<Tensor(const Tensor&)>;
struct NamedLayout {
  const char* name;
  Layout apply;
};
const std::vector<NamedLayout> kLayouts = {
    {"contiguous", [](const Tensor& t) { return t; }},
    {"transposed", [](const Tensor& t) { return transposed(t); }},
    {"stepped", [](const Tensor& t) { return stepped(t); }},
};

// An op's output and the gradients of sum(out * w) (w fresh random, the same on both
// devices) with respect to each defined input.
struct Result {
  Tensor out;
  std::vector<Tensor> grads;
};

using Op = std::function<Tensor(const std::vector<Tensor>&)>;

Result run_op(const Op& op, const std::vector<Tensor>& inputs, Device device, uint64_t weight_seed) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.defined() ? t.detach().to(device).requires_grad_() : Tensor());
  Result r;
  r.out = op(leaves);
  Tensor w = random(r.out.shape(), r.out.dtype(), weight_seed).to(device);
  sum(mul(r.out, w)).backward();
  for (const Tensor& leaf : leaves) r.grads.push_back(leaf.defined() ? leaf.grad() : Tensor());
  return r;
}

// The op on the CPU and on the GPU, outputs and gradients compared by normalised error
// (tol > 0) or bit for bit (tol == 0). Returns the GPU result for further checks.
Result check_op(const Op& op, const std::vector<Tensor>& inputs, double tol, uint64_t weight_seed = 7) {
  const Result cpu = run_op(op, inputs, kCPU, weight_seed);
  const Result cuda = run_op(op, inputs, gpu(), weight_seed);
  REQUIRE(cuda.out.device() == gpu());
  if (tol > 0) CHECK_NORMALISED(cuda.out, cpu.out, tol);
  else CHECK_IDENTICAL(cuda.out, cpu.out);
  for (size_t i = 0; i < inputs.size(); ++i) {
    CAPTURE(i);
    REQUIRE(cpu.grads[i].defined() == cuda.grads[i].defined());
    if (!cpu.grads[i].defined()) continue;
    if (tol > 0) CHECK_NORMALISED(cuda.grads[i], cpu.grads[i], tol);
    else CHECK_IDENTICAL(cuda.grads[i], cpu.grads[i]);
  }
  return cuda;
}

// Runs op twice on the GPU: the outputs and gradients must be the same bits.
void check_deterministic(const Op& op, const std::vector<Tensor>& inputs) {
  const Result first = run_op(op, inputs, gpu(), 11);
  const Result second = run_op(op, inputs, gpu(), 11);
  CHECK_IDENTICAL(second.out, first.out);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (first.grads[i].defined()) CHECK_IDENTICAL(second.grads[i], first.grads[i]);
}

// Restores the TF32 setting when a test ends, even by a failed REQUIRE.
struct Tf32Guard {
  bool saved = cuda::allow_tf32();
  explicit Tf32Guard(bool allow) { cuda::set_allow_tf32(allow); }
  ~Tf32Guard() { cuda::set_allow_tf32(saved); }
};

// Restores the deterministic-algorithms switch when a test ends.
struct DeterministicGuard {
  bool saved = deterministic_algorithms();
  explicit DeterministicGuard(bool on) { use_deterministic_algorithms(on); }
  ~DeterministicGuard() { use_deterministic_algorithms(saved); }
};

}  // namespace

// --- matmul ----------------------------------------------------------------------------

TEST_CASE("matmul matches the CPU: odd, batched, broadcast and empty shapes, in every layout") {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{1, 1}, {1, 1}},         {{7, 5}, {5, 3}},          {{33, 1000}, {1000, 17}}, {{1, 257}, {257, 1}},
      {{64, 1}, {1, 65}},       {{7}, {7}},                {{7}, {7, 3}},            {{4, 7}, {7}},
      {{5, 7, 3}, {5, 3, 4}},   {{2, 1, 7, 3}, {4, 3, 5}}, {{3, 7, 3}, {3, 5}},      {{7, 3}, {2, 3, 3, 5}},
      {{0, 3}, {3, 4}},         {{3, 0}, {0, 4}},          {{0, 4, 5}, {0, 5, 2}},   {{2, 3, 0}, {2, 0, 6}},
      {{129, 130}, {130, 131}},
  };
  uint64_t seed = 1;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
    for (const auto& operands : shapes) {
      const Shape &sa = operands.first, &sb = operands.second;
      const Tensor a = random(sa, dtype, ++seed), b = random(sb, dtype, ++seed);
      for (const NamedLayout& la : kLayouts) {
        for (const NamedLayout& lb : kLayouts) {
          CAPTURE(dtype);
          CAPTURE(sa);
          CAPTURE(sb);
          CAPTURE(la.name);
          CAPTURE(lb.name);
          check_op([&](const std::vector<Tensor>& in) { return matmul(la.apply(in[0]), lb.apply(in[1])); }, {a, b},
                   tol_of(dtype));
        }
      }
    }
  }
}

TEST_CASE("matmul: transposed views, expanded batches and expanded rows") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const double tol = tol_of(dtype);
    // Column-major matrices (cuBLAS's op T), batched.
    check_op([](const std::vector<Tensor>& in) { return matmul(in[0].transpose(-1, -2), in[1].transpose(-1, -2)); },
             {random({4, 9, 6}, dtype, 1), random({4, 5, 9}, dtype, 2)}, tol);
    // A broadcast batch (stride 0) whose matrices must be copied: the copy keeps the broadcast.
    check_op([](const std::vector<Tensor>& in) { return matmul(stepped(in[0]).expand({6, 7, 3}), in[1]); },
             {random({1, 7, 3}, dtype, 3), random({6, 3, 5}, dtype, 4)}, tol);
    // Batch dims that do not merge (a broadcast over the inner one, b over the outer one).
    check_op([](const std::vector<Tensor>& in) {
      return matmul(in[0].expand({3, 4, 7, 3}), in[1].expand({3, 4, 3, 5}));
    }, {random({3, 1, 7, 3}, dtype, 5), random({1, 4, 3, 5}, dtype, 6)}, tol);
    // An expanded row (row stride 0) is neither row- nor column-major.
    check_op([](const std::vector<Tensor>& in) { return matmul(in[0].expand({5, 4}), in[1]); },
             {random({1, 4}, dtype, 7), random({4, 3}, dtype, 8)}, tol);
    // mm, bmm and linear (bias copied into the output, then accumulated into).
    check_op([](const std::vector<Tensor>& in) { return mm(in[0], in[1].t()); },
             {random({8, 16}, dtype, 9), random({12, 16}, dtype, 10)}, tol);
    check_op([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); },
             {random({3, 2, 5}, dtype, 11), random({3, 5, 4}, dtype, 12)}, tol);
    check_op([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
             {random({2, 5, 16}, dtype, 13), random({9, 16}, dtype, 14), random({9}, dtype, 15)}, tol);
    check_op([](const std::vector<Tensor>& in) { return linear(transposed(in[0]), in[1]); },
             {random({6, 16}, dtype, 16), random({9, 16}, dtype, 17)}, tol);
  }
}

TEST_CASE("matmul kernel overwrites a poisoned output, accumulates when asked, and is deterministic") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Tensor a = random({3, 40, 300}, dtype, 20), b = random({3, 300, 50}, dtype, 21);
    Tensor expected = empty({3, 40, 50}, TensorOptions(dtype));
    matmul_stub(kCPU, a, b, expected, false);
    Tensor out = poisoned({3, 40, 50}, dtype, gpu());
    matmul_stub(gpu(), on_gpu(a), on_gpu(b), out, false);
    CHECK_NORMALISED(out, expected, tol_of(dtype));
    // accumulate: out += a @ b.
    const Tensor base = random({3, 40, 50}, dtype, 22);
    Tensor acc_cpu = base.clone(), acc_gpu = on_gpu(base);
    matmul_stub(kCPU, a, b, acc_cpu, true);
    matmul_stub(gpu(), on_gpu(a), on_gpu(b), acc_gpu, true);
    CHECK_NORMALISED(acc_gpu, acc_cpu, tol_of(dtype));
    // k == 0: zeros, or the output unchanged.
    Tensor empty_k = poisoned({4, 5}, dtype, gpu());
    matmul_stub(gpu(), empty({4, 0}, TensorOptions(dtype, gpu())), empty({0, 5}, TensorOptions(dtype, gpu())),
                empty_k, false);
    CHECK_IDENTICAL(empty_k, zeros({4, 5}, TensorOptions(dtype)));
    Tensor kept = on_gpu(base.select(0, 0));
    matmul_stub(gpu(), empty({40, 0}, TensorOptions(dtype, gpu())), empty({0, 50}, TensorOptions(dtype, gpu())),
                kept, true);
    CHECK_IDENTICAL(kept, base.select(0, 0));
    // Two runs, same bits.
    Tensor again = poisoned({3, 40, 50}, dtype, gpu());
    matmul_stub(gpu(), on_gpu(a), on_gpu(b), again, false);
    CHECK_IDENTICAL(again, out);
  }
  check_deterministic([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                      {random({2, 65, 513}, DType::Float32, 23), random({513, 33}, DType::Float32, 24)});
}

TEST_CASE("matmul with TF32 allowed stays within TF32's precision") {
  const Tensor a = random({64, 256}, DType::Float32, 30), b = random({256, 48}, DType::Float32, 31);
  const Tensor expected = matmul(a, b);
  Tf32Guard tf32(true);
  // TF32 keeps 10 mantissa bits: about 1e-3 of the largest value, never 1e-1.
  CHECK_NORMALISED(matmul(on_gpu(a), on_gpu(b)), expected, 1e-2);
}

// --- conv2d ----------------------------------------------------------------------------

namespace {

struct ConvConfig {
  Shape input, weight;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
};

const std::vector<ConvConfig> kConvConfigs = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}},                    // same padding
    {{2, 3, 9, 8}, {5, 3, 3, 2}, {2, 3}, {1, 2}, {2, 1}},            // stride, padding, dilation per dim
    {{1, 2, 5, 5}, {3, 2, 5, 5}},                                    // kernel covers the input: 1x1 out
    {{3, 2, 4, 4}, {2, 2, 3, 3}, {1, 1}, {2, 2}, {1, 1}, 1, false},  // wide padding, no bias
    {{2, 4, 9, 7}, {6, 2, 3, 2}, {1, 2}, {1, 0}, {1, 1}, 2},         // groups = 2
    {{2, 3, 8, 7}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 3},         // depthwise
    {{2, 3, 6, 5}, {6, 1, 3, 3}, {2, 1}, {1, 1}, {1, 2}, 3},         // depthwise, multiplier 2
    {{3, 5, 4, 6}, {7, 5, 1, 1}},                                    // 1x1
    {{2, 5, 7, 6}, {3, 5, 1, 1}, {2, 2}},                            // 1x1 with stride
    {{4, 1, 28, 28}, {16, 1, 5, 5}, {1, 1}, {2, 2}},                 // a ConvNet's first layer
    {{3, 16, 14, 14}, {32, 16, 5, 5}, {1, 1}, {2, 2}},               // ... and its second
    {{8, 64, 17, 15}, {64, 64, 3, 3}, {1, 1}, {1, 1}},               // wide enough for Winograd / FFT
    {{3, 4, 5}, {2, 3, 2, 3}, {1, 1}, {1, 0}},                       // unbatched [C, H, W]
    {{2, 1, 11, 3}, {2, 1, 4, 1}, {3, 1}, {0, 1}, {2, 1}},           // odd, thin
};

Tensor run_conv(const std::vector<Tensor>& in, const ConvConfig& c) {
  return conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
}

}  // namespace

TEST_CASE("conv2d forward and backward match the CPU") {
  uint64_t seed = 100;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const ConvConfig& c : kConvConfigs) {
      CAPTURE(dtype);
      CAPTURE(c.input);
      CAPTURE(c.weight);
      const Tensor x = random(c.input, dtype, ++seed), w = random(c.weight, dtype, ++seed);
      const Tensor b = random({c.weight[0]}, dtype, ++seed);
      check_op([&](const std::vector<Tensor>& in) { return run_conv(in, c); }, {x, w, b}, timed_conv_tol_of(dtype));
      // Non-contiguous operands are copied by the op; the kernel sees the same values.
      check_op([&](const std::vector<Tensor>& in) {
        return run_conv({transposed(in[0]), transposed(in[1]), in[2]}, c);
      }, {x, w, b}, timed_conv_tol_of(dtype));
    }
  }
}

TEST_CASE("conv2d computes only the gradients that are asked for, and runs deterministically") {
  const ConvConfig c{{4, 8, 12, 11}, {16, 4, 3, 3}, {2, 1}, {1, 1}, {1, 2}, 2};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Tensor x = random(c.input, dtype, 1), w = random(c.weight, dtype, 2), b = random({16}, dtype, 3);
    const auto op = [&](const std::vector<Tensor>& in) {
      return conv2d(in[0].defined() ? in[0] : x.to(gpu()), in[1].defined() ? in[1] : w.to(gpu()),
                    in[2].defined() ? in[2] : b.to(gpu()), c.stride, c.padding, c.dilation, c.groups);
    };
    // One input requiring grad at a time (the others are plain GPU tensors).
    const Result all = run_op([&](const std::vector<Tensor>& in) { return run_conv(in, c); }, {x, w, b}, gpu(), 5);
    for (size_t only = 0; only < 3; ++only) {
      CAPTURE(only);
      std::vector<Tensor> inputs(3);
      inputs[only] = std::vector<Tensor>{x, w, b}[only];
      const Result one = run_op(op, inputs, gpu(), 5);
      CHECK_IDENTICAL(one.out, all.out);
      CHECK_IDENTICAL(one.grads[only], all.grads[only]);
    }
    check_deterministic([&](const std::vector<Tensor>& in) { return run_conv(in, c); }, {x, w, b});
  }
}

TEST_CASE("conv2d kernels overwrite poisoned outputs") {
  const ConvConfig c{{3, 6, 9, 10}, {4, 3, 3, 2}, {1, 2}, {1, 1}, {2, 1}, 2};
  const Conv2dParams p{c.stride, c.padding, c.dilation, c.groups};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Tensor x = random(c.input, dtype, 1), w = random(c.weight, dtype, 2), b = random({4}, dtype, 3);
    const Tensor expected = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    const Shape out_shape = expected.shape();
    Tensor out = poisoned(out_shape, dtype, gpu());
    conv2d_forward_stub(gpu(), on_gpu(x), on_gpu(w), on_gpu(b), out, p);
    CHECK_NORMALISED(out, expected, timed_conv_tol_of(dtype));

    const Tensor gy = random(out_shape, dtype, 4);
    Tensor gx = empty(c.input, TensorOptions(dtype)), gw = empty(c.weight, TensorOptions(dtype)),
           gb = empty({4}, TensorOptions(dtype));
    conv2d_backward_stub(kCPU, gy, x, w, gx, gw, gb, p);
    Tensor cx = poisoned(c.input, dtype, gpu()), cw = poisoned(c.weight, dtype, gpu());
    Tensor cb = poisoned({4}, dtype, gpu());
    conv2d_backward_stub(gpu(), on_gpu(gy), on_gpu(x), on_gpu(w), cx, cw, cb, p);
    CHECK_NORMALISED(cx, gx, timed_conv_tol_of(dtype));
    CHECK_NORMALISED(cw, gw, timed_conv_tol_of(dtype));
    CHECK_NORMALISED(cb, gb, timed_conv_tol_of(dtype));
  }
}

TEST_CASE("conv2d with TF32 allowed stays within TF32's precision") {
  const ConvConfig c{{4, 32, 16, 16}, {32, 32, 3, 3}, {1, 1}, {1, 1}};
  const Tensor x = random(c.input, DType::Float32, 1), w = random(c.weight, DType::Float32, 2);
  const Tensor b = random({32}, DType::Float32, 3);
  Tf32Guard tf32(true);
  check_op([&](const std::vector<Tensor>& in) { return run_conv(in, c); }, {x, w, b}, 1e-2);
}

TEST_CASE("conv2d with deterministic algorithms: cuDNN's heuristic choice matches the CPU and repeats") {
  DeterministicGuard deterministic(true);
  uint64_t seed = 500;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const ConvConfig& c : kConvConfigs) {
      CAPTURE(dtype);
      CAPTURE(c.input);
      CAPTURE(c.weight);
      const Tensor x = random(c.input, dtype, ++seed), w = random(c.weight, dtype, ++seed);
      const Tensor b = random({c.weight[0]}, dtype, ++seed);
      check_op([&](const std::vector<Tensor>& in) { return run_conv(in, c); }, {x, w, b}, conv_tol_of(dtype));
      check_deterministic([&](const std::vector<Tensor>& in) { return run_conv(in, c); }, {x, w, b});
    }
  }
}

// What conv.cpp runs where cuDNN has no acceptable algorithm (kernels/cuda/direct_conv.h),
// called directly: cuDNN offers a deterministic algorithm for most geometries, so the
// fallback would otherwise go untested.
TEST_CASE("weft's direct conv2d kernels match the CPU for every convolution knob") {
  uint64_t seed = 700;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const ConvConfig& c : kConvConfigs) {
      if (c.input.size() != 4) continue;  // the kernels take a batch; conv2d adds the dim itself
      CAPTURE(dtype);
      CAPTURE(c.input);
      CAPTURE(c.weight);
      const Conv2dParams p{c.stride, c.padding, c.dilation, c.groups};
      const Tensor x = random(c.input, dtype, ++seed), w = random(c.weight, dtype, ++seed);
      const Tensor expected = conv2d(x, w, Tensor(), c.stride, c.padding, c.dilation, c.groups);
      const Shape& o = expected.shape();
      const cuda::DirectConvGeometry g{c.input[0], c.input[1], c.input[2], c.input[3], o[1], o[2], o[3],
                                       c.weight[2], c.weight[3], p};
      const Tensor gx_in = on_gpu(x), gw_in = on_gpu(w);
      Tensor out = poisoned(o, dtype, gpu());
      cuda::direct_conv2d_forward(dtype, gx_in.raw_data(), gw_in.raw_data(), out.raw_data(), g, gpu());
      CHECK_NORMALISED(out, expected, conv_tol_of(dtype));

      const Tensor gy = random(o, dtype, ++seed);
      Tensor gx = empty(c.input, TensorOptions(dtype)), gw = empty(c.weight, TensorOptions(dtype));
      conv2d_backward_stub(kCPU, gy, x, w, gx, gw, Tensor(), p);
      const Tensor gy_in = on_gpu(gy);
      Tensor cx = poisoned(c.input, dtype, gpu()), cw = poisoned(c.weight, dtype, gpu());
      cuda::direct_conv2d_backward_input(dtype, gy_in.raw_data(), gw_in.raw_data(), cx.raw_data(), g, gpu());
      cuda::direct_conv2d_backward_weight(dtype, gx_in.raw_data(), gy_in.raw_data(), cw.raw_data(), false, g, gpu());
      CHECK_NORMALISED(cx, gx, conv_tol_of(dtype));
      CHECK_NORMALISED(cw, gw, conv_tol_of(dtype));
      // Chunks of a batch add into grad_weight.
      cuda::direct_conv2d_backward_weight(dtype, gx_in.raw_data(), gy_in.raw_data(), cw.raw_data(), true, g, gpu());
      CHECK_NORMALISED(cw, mul(gw, 2.0), conv_tol_of(dtype));
    }
  }
}

// --- pooling ---------------------------------------------------------------------------

namespace {

// Values on a grid of 0.5 (so windows hold ties), with NaN and -inf sprinkled in when asked.
Tensor tied_values(const Shape& shape, DType dtype, uint64_t seed, bool specials) {
  std::vector<double> v = random(shape, DType::Float64, seed).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i] * 2) / 2;
    if (specials && i % 37 == 5) v[i] = kNaN;
    if (specials && i % 41 == 7) v[i] = -kInf;
  }
  return tensor<double>(v, shape).to(dtype);
}

struct PoolConfig {
  Shape input;
  std::array<int64_t, 2> kernel, stride, padding, dilation{1, 1};
  bool ceil_mode = false;
};

const std::vector<PoolConfig> kPoolConfigs = {
    {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}},                  // the common 2x2 pool
    {{2, 3, 9, 7}, {3, 3}, {1, 1}, {1, 1}},                  // overlapping windows, padding
    {{1, 2, 11, 10}, {3, 2}, {2, 3}, {1, 1}, {2, 1}},        // dilation, non-square
    {{2, 2, 7, 9}, {3, 3}, {2, 2}, {1, 0}, {1, 1}, true},    // ceil_mode: cut windows
    {{3, 1, 5, 6}, {2, 3}, {3, 2}, {1, 1}, {1, 2}, true},    // ceil_mode with dilation
    {{1, 1, 1, 1}, {1, 1}, {1, 1}, {0, 0}},                  // a single element
    {{8, 16, 33, 31}, {3, 3}, {2, 2}, {1, 1}},               // many planes
    {{2, 3, 6, 5}, {5, 4}, {1, 1}, {2, 2}},                  // windows larger than the stride
};

}  // namespace

TEST_CASE("max_pool2d: values, indices and gradients equal the CPU's, ties and NaN included") {
  uint64_t seed = 300;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const PoolConfig& c : kPoolConfigs) {
      for (bool specials : {false, true}) {
        for (const NamedLayout& layout : kLayouts) {
          CAPTURE(dtype);
          CAPTURE(c.input);
          CAPTURE(specials);
          CAPTURE(layout.name);
          const Tensor x = tied_values(c.input, dtype, ++seed, specials);
          const auto op = [&](const std::vector<Tensor>& in) {
            return max_pool2d(layout.apply(in[0]), c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
          };
          check_op(op, {x}, 0);
          const auto [out_cpu, idx_cpu] =
              max_pool2d_with_indices(layout.apply(x), c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
          const auto [out_gpu, idx_gpu] =
              max_pool2d_with_indices(layout.apply(on_gpu(x)), c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
          CHECK_IDENTICAL(out_gpu, out_cpu);
          CHECK_IDENTICAL(idx_gpu, idx_cpu);
        }
      }
    }
  }
}

TEST_CASE("max_pool2d backward kernel: colliding indices add in output order, every element written") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    // A 3x3, stride-1 pool over tied values: many outputs pick the same input.
    const Tensor x = tied_values({4, 5, 12, 13}, dtype, 1, true);
    const auto [out, idx] = max_pool2d_with_indices(x, {3, 3}, {1, 1}, {1, 1});
    const Tensor go = random(out.shape(), dtype, 2);
    Tensor expected = empty(x.shape(), TensorOptions(dtype));
    max_pool2d_backward_stub(kCPU, go, idx, expected);
    Tensor actual = poisoned(x.shape(), dtype, gpu());
    max_pool2d_backward_stub(gpu(), on_gpu(go), on_gpu(idx), actual);
    CHECK_IDENTICAL(actual, expected);
    Tensor again = poisoned(x.shape(), dtype, gpu());
    max_pool2d_backward_stub(gpu(), on_gpu(go), on_gpu(idx), again);
    CHECK_IDENTICAL(again, actual);
  }
}

TEST_CASE("avg_pool2d: forward and backward equal the CPU's, every divisor rule") {
  uint64_t seed = 400;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const PoolConfig& c : kPoolConfigs) {
      if (c.dilation != std::array<int64_t, 2>{1, 1}) continue;  // avg_pool2d has no dilation
      for (bool include_pad : {true, false}) {
        for (const NamedLayout& layout : kLayouts) {
          CAPTURE(dtype);
          CAPTURE(c.input);
          CAPTURE(include_pad);
          CAPTURE(layout.name);
          check_op([&](const std::vector<Tensor>& in) {
            return avg_pool2d(layout.apply(in[0]), c.kernel, c.stride, c.padding, c.ceil_mode, include_pad);
          }, {random(c.input, dtype, ++seed)}, 0);
        }
      }
    }
  }
}

TEST_CASE("adaptive_avg_pool2d: even, uneven and growing bins equal the CPU's") {
  const std::vector<std::pair<Shape, std::array<int64_t, 2>>> cases = {
      {{2, 3, 8, 8}, {4, 4}}, {{2, 3, 7, 5}, {3, 2}}, {{1, 2, 3, 3}, {5, 4}},
      {{4, 6, 9, 11}, {1, 1}}, {{8, 16, 13, 17}, {7, 7}}, {{1, 1, 1, 1}, {2, 3}},
  };
  uint64_t seed = 500;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const auto& c : cases) {
      const Shape& shape = c.first;
      const std::array<int64_t, 2>& size = c.second;
      for (const NamedLayout& layout : kLayouts) {
        CAPTURE(dtype);
        CAPTURE(shape);
        CAPTURE(layout.name);
        check_op([&](const std::vector<Tensor>& in) {
          return adaptive_avg_pool2d(layout.apply(in[0]), size);
        }, {random(shape, dtype, ++seed)}, 0);
      }
    }
  }
}

TEST_CASE("average pooling backward kernels write every element of a poisoned grad_input") {
  const Pool2dGeometry g{{3, 2}, {2, 2}, {1, 1}, {1, 1}};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Shape in_shape{2, 3, 9, 8};
    const Tensor go = random({2, 3, 5, 5}, dtype, 1);
    for (bool include_pad : {true, false}) {
      Tensor expected = empty(in_shape, TensorOptions(dtype));
      avg_pool2d_backward_stub(kCPU, go, expected, g, include_pad);
      Tensor actual = poisoned(in_shape, dtype, gpu());
      avg_pool2d_backward_stub(gpu(), on_gpu(go), actual, g, include_pad);
      CHECK_IDENTICAL(actual, expected);
    }
    Tensor expected = empty(in_shape, TensorOptions(dtype));
    adaptive_avg_pool2d_backward_stub(kCPU, go, expected);
    Tensor actual = poisoned(in_shape, dtype, gpu());
    adaptive_avg_pool2d_backward_stub(gpu(), on_gpu(go), actual);
    CHECK_IDENTICAL(actual, expected);
  }
}

TEST_CASE("pooling: 3-d inputs and the empty batch") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Tensor x = random({3, 7, 6}, dtype, 1);
    check_op([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2, 2}); }, {x}, 0);
    check_op([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, true); }, {x}, 0);
    check_op([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {4, 4}); }, {x}, 0);
    const Tensor none = random({0, 3, 7, 6}, dtype, 2);
    check_op([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2, 2}); }, {none}, 0);
    check_op([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {2, 2}); }, {none}, 0);
    check_op([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {3, 3}); }, {none}, 0);
  }
}

// --- batch norm ------------------------------------------------------------------------

namespace {

struct BnCase {
  Shape input;
  bool affine;
  double offset;  // added to the input: a mean that dwarfs the spread
};

const std::vector<BnCase> kBnCases = {
    {{7, 5}, true, 0},         {{4, 3, 5, 7}, true, 0},   {{4, 3, 5, 7}, false, 0},  {{2, 1, 1}, true, 0},
    {{3, 6, 11}, true, 1000},  {{2, 3, 300, 301}, true, 0.5}, {{100003, 3}, true, 0}, {{5, 2, 3, 2, 3}, true, 0},
};

}  // namespace

TEST_CASE("batch_norm training: output, running statistics and gradients match the CPU") {
  uint64_t seed = 600;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const BnCase& c : kBnCases) {
      CAPTURE(dtype);
      CAPTURE(c.input);
      CAPTURE(c.affine);
      const int64_t channels = c.input[1];
      const Tensor x = add(random(c.input, dtype, ++seed), c.offset);
      const Tensor w = c.affine ? random({channels}, dtype, ++seed) : Tensor();
      const Tensor b = c.affine ? random({channels}, dtype, ++seed) : Tensor();
      const Tensor rm = random({channels}, dtype, ++seed), rv = random({channels}, dtype, ++seed, 0.5, 2);
      // Running statistics as strided views on both devices.
      Tensor rm_cpu = test::noncontiguous(rm), rv_cpu = test::noncontiguous(rv);
      Tensor rm_gpu = test::noncontiguous(on_gpu(rm)), rv_gpu = test::noncontiguous(on_gpu(rv));
      const auto op = [&](const std::vector<Tensor>& in) {
        const bool on_cuda = in[0].device().is_cuda();
        return batch_norm(in[0], on_cuda ? rm_gpu : rm_cpu, on_cuda ? rv_gpu : rv_cpu, in[1], in[2], true, 0.3, 1e-5);
      };
      check_op(op, {x, w, b}, bn_tol_of(dtype));
      CHECK_NORMALISED(rm_gpu, rm_cpu, bn_tol_of(dtype));
      CHECK_NORMALISED(rv_gpu, rv_cpu, bn_tol_of(dtype));
    }
  }
}

TEST_CASE("batch_norm evaluation: output and gradients match the CPU, eps 0 included") {
  uint64_t seed = 700;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const BnCase& c : kBnCases) {
      for (double eps : {1e-5, 0.0}) {
        CAPTURE(dtype);
        CAPTURE(c.input);
        CAPTURE(eps);
        const int64_t channels = c.input[1];
        const Tensor x = add(random(c.input, dtype, ++seed), c.offset);
        const Tensor rm = add(random({channels}, dtype, ++seed), c.offset);
        const Tensor rv = random({channels}, dtype, ++seed, 0.5, 2);
        const Tensor w = c.affine ? random({channels}, dtype, ++seed) : Tensor();
        const Tensor b = c.affine ? random({channels}, dtype, ++seed) : Tensor();
        check_op([&](const std::vector<Tensor>& in) {
          const Device d = in[0].device();
          return batch_norm(in[0], rm.to(d), test::noncontiguous(rv.to(d)), in[1], in[2], false, 0.1, eps);
        }, {x, w, b}, bn_tol_of(dtype));
      }
    }
  }
}

TEST_CASE("batch_norm: the empty batch in evaluation, and deterministic training") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const Tensor rm = random({3}, dtype, 1), rv = random({3}, dtype, 2, 0.5, 2);
    check_op([&](const std::vector<Tensor>& in) {
      const Device d = in[0].device();
      return batch_norm(in[0], rm.to(d), rv.to(d), in[1], in[2], false);
    }, {random({0, 3, 4}, dtype, 3), random({3}, dtype, 4), random({3}, dtype, 5)}, bn_tol_of(dtype));
    check_deterministic([](const std::vector<Tensor>& in) {
      return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true);
    }, {random({16, 8, 40, 41}, dtype, 6), random({8}, dtype, 7), random({8}, dtype, 8)});
  }
}

TEST_CASE("batch_norm kernels overwrite poisoned outputs") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const TensorOptions cpu_opts(dtype);
    const Tensor x = random({6, 4, 35}, dtype, 1), g = random({6, 4, 35}, dtype, 2);
    const Tensor w = random({4}, dtype, 3), b = random({4}, dtype, 4);
    Tensor mean = empty({4}, cpu_opts), var = empty({4}, cpu_opts);
    batch_norm_stats_stub(kCPU, x, mean, var, Tensor(), Tensor(), 0.1);
    Tensor mean_gpu = poisoned({4}, dtype, gpu()), var_gpu = poisoned({4}, dtype, gpu());
    batch_norm_stats_stub(gpu(), on_gpu(x), mean_gpu, var_gpu, Tensor(), Tensor(), 0.1);
    CHECK_NORMALISED(mean_gpu, mean, bn_tol_of(dtype));
    CHECK_NORMALISED(var_gpu, var, bn_tol_of(dtype));

    Tensor out = empty(x.shape(), cpu_opts);
    batch_norm_forward_stub(kCPU, x, mean, var, 1e-5, w, b, out);
    Tensor out_gpu = poisoned(x.shape(), dtype, gpu());
    batch_norm_forward_stub(gpu(), on_gpu(x), on_gpu(mean), on_gpu(var), 1e-5, on_gpu(w), on_gpu(b), out_gpu);
    CHECK_NORMALISED(out_gpu, out, bn_tol_of(dtype));

    for (bool training : {true, false}) {
      CAPTURE(training);
      Tensor gi = empty(x.shape(), cpu_opts), gw = empty({4}, cpu_opts), gb = empty({4}, cpu_opts);
      batch_norm_backward_stub(kCPU, g, x, mean, var, 1e-5, w, training, gi, gw, gb);
      Tensor gi_gpu = poisoned(x.shape(), dtype, gpu()), gw_gpu = poisoned({4}, dtype, gpu()),
             gb_gpu = poisoned({4}, dtype, gpu());
      batch_norm_backward_stub(gpu(), on_gpu(g), on_gpu(x), on_gpu(mean), on_gpu(var), 1e-5, on_gpu(w), training,
                               gi_gpu, gw_gpu, gb_gpu);
      CHECK_NORMALISED(gi_gpu, gi, bn_tol_of(dtype));
      CHECK_NORMALISED(gw_gpu, gw, bn_tol_of(dtype));
      CHECK_NORMALISED(gb_gpu, gb, bn_tol_of(dtype));
    }
  }
}
