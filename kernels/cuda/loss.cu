// CUDA loss kernels (contract: kernels/loss_kernels.h; reference semantics:
// kernels/cpu/loss.cpp, whose formulas and rounding steps these follow).
//
//   nll_loss            a thread per position (forward) or per input element (backward).
//   cross_entropy       fused: one online pass over a position's logits gives its max and
//                       the float64 sum of exp(x - max) (the online softmax of
//                       kernels/cuda/online_softmax.cuh), a second pass only with label
//                       smoothing; only lse is kept. Rows of contiguous classes (post == 1)
//                       go to 4 or 32 lanes of a warp, or a whole block for many classes;
//                       with post > 1 a thread walks one position's classes, and adjacent
//                       threads read adjacent positions. Backward: a thread per element,
//                       softmax recomputed from lse.
//   mse_loss            elementwise, or a deterministic float64 sum: fixed segments per
//                       block, partials folded in segment order by a second kernel.
//
// A target that is neither ignore_index nor in [0, C) is never used as an index here:
// forward writes 0 for its position and finds the first such position (the smallest,
// found with an integer atomicMin, so the answer does not depend on timing), which a
// one-thread kernel then records as a device-side error (Note [Device-side errors],
// kernels/cuda/device_error_record.h): the host raises it at its next synchronisation
// instead of waiting for every loss. Backward writes 0 where the CPU, trusting forward's
// check, would index with it. No floating point atomics: every sum has a fixed order and
// is bitwise reproducible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/device_error.h"
#include "kernels/cuda/group_reduce.cuh"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/online_softmax.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/loss_kernels.h"

namespace weft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int64_t kMaxGrid = 1 << 16;  // grid-stride loops beyond (results do not depend on the grid)
// An mse segment is 64 KiB of each input: a block's work, one float64 partial.
constexpr int64_t kSegmentBytes = 64 * 1024;
// Backward kernels divide element indices in 32 bits up to here.
constexpr int64_t kMaxUint32Index = std::numeric_limits<uint32_t>::max();

int grid_for(int64_t blocks) { return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxGrid)); }
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid-stride index loop bounds for elementwise kernels.
#define WEFT_FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

template <class T>
struct ClassView {
  const int64_t* __restrict__ target;
  const T* __restrict__ weight;  // null: every class weighs 1
  int64_t c, post, ignore_index;

  __device__ bool ignored(int64_t t) const { return t == ignore_index; }
  __device__ bool valid(int64_t t) const { return t >= 0 && t < c; }
  __device__ double weight_of(int64_t k) const { return weight ? static_cast<double>(weight[k]) : 1.0; }
  // Offset of class 0 of position i in the [N, C, post] input.
  __device__ int64_t base(int64_t i) const { return (i / post) * c * post + i % post; }
  // Position and class of element e of the [N, C, post] input, dividing in the index
  // type I (32-bit division is a few instructions, 64-bit a long software sequence).
  template <class I>
  __device__ void locate(int64_t e, int64_t& position, int64_t& k) const {
    const I ei = static_cast<I>(e), ci = static_cast<I>(c), pi = static_cast<I>(post);
    if (post == 1) {
      const I n = ei / ci;
      position = n;
      k = ei - n * ci;
      return;
    }
    const I q = ei / pi, n = q / ci;
    k = q - n * ci;
    position = int64_t{n} * post + (ei - q * pi);
  }
};

template <class T>
ClassView<T> class_view(const Tensor& target, const Tensor& weight, int64_t c, int64_t post, int64_t ignore_index) {
  return {static_cast<const int64_t*>(target.raw_data()),
          weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr, c, post, ignore_index};
}

constexpr unsigned long long kNoBadTarget = 0x7f7f7f7f7f7f7f7full;  // above any position

// Records the bad target at the smallest position, if any, as a device-side error.
__global__ void publish_bad_target(const unsigned long long* first_bad, const int64_t* target, int64_t c,
                                   int64_t ignore_index, DeviceErrorSink sink, const char* op) {
  const unsigned long long position = *first_bad;
  if (position == kNoBadTarget) return;
  const auto i = static_cast<int64_t>(position);
  report_device_error(sink, DeviceErrorKind::TargetOutOfRange, op, target[i], i, c, ignore_index);
}

// The smallest position with a bad target, kept on the device (an integer atomicMin, so
// the result does not depend on which thread comes first), then published as a
// device-side error by one thread: the host never waits for it.
class FirstBad {
 public:
  FirstBad(Device device, cudaStream_t stream)
      : flag_(empty({1}, TensorOptions(DType::Int64, device))), stream_(stream), device_(device) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(flag_.raw_data(), 0x7f, sizeof(int64_t), stream_));  // kNoBadTarget
  }
  unsigned long long* data() const { return static_cast<unsigned long long*>(flag_.raw_data()); }
  // After the forward kernel, on its stream; `op` is a string literal.
  void publish(const char* op, const Tensor& target, int64_t c, int64_t ignore_index) const {
    publish_bad_target<<<1, 1, 0, stream_>>>(data(), static_cast<const int64_t*>(target.raw_data()), c,
                                             ignore_index, device_error_sink(device_), op);
    WEFT_CUDA_CHECK_LAUNCH(op, stream_);
  }

 private:
  Tensor flag_;
  cudaStream_t stream_;
  Device device_;
};

__device__ __forceinline__ void report_bad(unsigned long long* first_bad, int64_t position) {
  atomicMin(first_bad, static_cast<unsigned long long>(position));
}

// --- nll_loss ---------------------------------------------------------------------------

template <class T>
__global__ void nll_forward_kernel(ClassView<T> v, const T* __restrict__ x, int64_t positions, T* __restrict__ loss,
                                   T* __restrict__ target_weight, unsigned long long* first_bad) {
  WEFT_FOR_EACH(i, positions) {
    const int64_t t = v.target[i];
    const bool use = !v.ignored(t) && v.valid(t);
    const double w = use ? v.weight_of(t) : 0.0;
    loss[i] = use ? static_cast<T>(-w * static_cast<double>(x[v.base(i) + t * v.post])) : T(0);
    if (target_weight) target_weight[i] = static_cast<T>(w);
    if (!v.ignored(t) && !v.valid(t)) report_bad(first_bad, i);
  }
}

template <class T, class I>
__global__ void nll_backward_kernel(ClassView<T> v, const T* __restrict__ grad, bool grad_is_scalar, int64_t elements,
                                    T* __restrict__ grad_in) {
  WEFT_FOR_EACH(e, elements) {
    int64_t i, k;
    v.template locate<I>(e, i, k);
    const int64_t t = v.target[i];
    const bool hit = k == t && !v.ignored(t) && v.valid(t);
    grad_in[e] = hit ? static_cast<T>(-v.weight_of(t) * static_cast<double>(grad[grad_is_scalar ? 0 : i])) : T(0);
  }
}

// --- cross_entropy ------------------------------------------------------------------------

template <class T>
struct CrossEntropyForward {
  ClassView<T> v;
  const T* __restrict__ logits;
  double smoothing;
  const double* weight_total;  // sum of the class weights (null: no weight, the total is C)
  T* __restrict__ loss;
  T* __restrict__ target_weight;  // null: not asked for
  double* __restrict__ lse;
  unsigned long long* first_bad;

  // Position i with an ignored or bad target: zeros, and a bad one is reported.
  __device__ void store_unused(int64_t i, int64_t t) const {
    loss[i] = T(0);
    lse[i] = 0;
    if (target_weight) target_weight[i] = T(0);
    if (!v.ignored(t)) report_bad(first_bad, i);
  }

  // Position i (target t in range) from its running max / sum and, with label smoothing,
  // shift = sum_k w_k (x_k - max); x points at class 0, classes `stride` apart.
  __device__ void store(int64_t i, int64_t t, RunningSoftmax<T> s, double shift, const T* x, int64_t stride) const {
    const double log_s = ::log(running_sum(s));
    lse[i] = static_cast<double>(s.max) + log_s;
    const double wt = v.weight_of(t);
    const double nll = log_s - static_cast<double>(static_cast<T>(x[t * stride] - s.max));
    double value = wt * nll;
    if (smoothing != 0) {
      // sum_k w_k (lse - x_k) = W log_s - sum_k w_k (x_k - max)
      const double total = weight_total ? *weight_total : static_cast<double>(v.c);
      value = (1 - smoothing) * wt * nll + smoothing / v.c * (total * log_s - shift);
    }
    loss[i] = static_cast<T>(value);
    if (target_weight) target_weight[i] = static_cast<T>(wt);
  }
};

// post == 1: G lanes (G <= 32) or the whole block (G == kThreads) per row of C classes.
template <class T, int G>
__global__ void __launch_bounds__(kThreads) cross_entropy_rows_kernel(CrossEntropyForward<T> f, int64_t rows) {
  constexpr int kGroups = kThreads / G;
  __shared__ RunningSoftmax<T> scratch[kWarps + 1];
  __shared__ double scratch_sum[kWarps + 1];
  const int lane = threadIdx.x % G;
  const int64_t c = f.v.c;
  auto combine = [](RunningSoftmax<T> a, RunningSoftmax<T> b) { return running_combine(a, b); };
  auto plus = [](double a, double b) { return a + b; };
  // `base` is the same for the whole block: every thread reaches the shuffles and barriers.
  for (int64_t base = blockIdx.x * int64_t{kGroups}; base < rows; base += gridDim.x * int64_t{kGroups}) {
    const int64_t row = base + threadIdx.x / G;
    const bool active = row < rows;
    const int64_t t = active ? f.v.target[row] : f.v.ignore_index;
    const bool use = active && !f.v.ignored(t) && f.v.valid(t);
    const T* x = f.logits + row * c;
    RunningSoftmax<T> s = running_identity<T>();
    if (use) {
#pragma unroll 4
      for (int64_t k = lane; k < c; k += G) s = running_add(s, x[k]);
    }
    s = lanes_allreduce<G, kThreads>(s, running_identity<T>(), combine, scratch);
    double shift = 0;
    if (f.smoothing != 0) {
      if (use)
        for (int64_t k = lane; k < c; k += G) shift += f.v.weight_of(k) * static_cast<double>(static_cast<T>(x[k] - s.max));
      shift = lanes_reduce<G, kThreads>(shift, 0.0, plus, scratch_sum);
    }
    if (active && lane == 0) {
      if (use) f.store(row, t, s, shift, x, 1);
      else f.store_unused(row, t);
    }
  }
}

// post > 1: a thread per position, its classes post apart.
template <class T>
__global__ void cross_entropy_columns_kernel(CrossEntropyForward<T> f, int64_t positions) {
  const int64_t c = f.v.c, post = f.v.post;
  WEFT_FOR_EACH(i, positions) {
    const int64_t t = f.v.target[i];
    if (f.v.ignored(t) || !f.v.valid(t)) {
      f.store_unused(i, t);
      continue;
    }
    const T* x = f.logits + f.v.base(i);
    RunningSoftmax<T> s = running_identity<T>();
    for (int64_t k = 0; k < c; ++k) s = running_add(s, x[k * post]);
    double shift = 0;
    if (f.smoothing != 0)
      for (int64_t k = 0; k < c; ++k) shift += f.v.weight_of(k) * static_cast<double>(static_cast<T>(x[k * post] - s.max));
    f.store(i, t, s, shift, x, post);
  }
}

// The sum of the C class weights in float64, by one block in a fixed order.
template <class T>
__global__ void __launch_bounds__(kThreads) weight_total_kernel(const T* __restrict__ weight, int64_t c, double* total) {
  __shared__ double scratch[kWarps + 1];
  double s = 0;
  for (int64_t k = threadIdx.x; k < c; k += kThreads) s += static_cast<double>(weight[k]);
  s = block_reduce<kThreads>(s, 0.0, [](double a, double b) { return a + b; }, scratch);
  if (threadIdx.x == 0) *total = s;
}

// grad_logits[k] = grad[i] * (Q softmax_k - q_k) (loss_kernels.h), with softmax_k from lse.
template <class T, class I>
__global__ void cross_entropy_backward_kernel(ClassView<T> v, const T* __restrict__ grad, bool grad_is_scalar,
                                              const T* __restrict__ x, const double* __restrict__ lse, double smoothing,
                                              const double* weight_total, int64_t elements, T* __restrict__ grad_in) {
  WEFT_FOR_EACH(e, elements) {
    int64_t i, k;
    v.template locate<I>(e, i, k);
    const int64_t t = v.target[i];
    if (v.ignored(t) || !v.valid(t)) {
      grad_in[e] = T(0);
      continue;
    }
    const double g = static_cast<double>(grad[grad_is_scalar ? 0 : i]);
    const double prob = static_cast<double>(exp_in(static_cast<T>(static_cast<double>(x[e]) - lse[i])));
    const double wt = v.weight_of(t);
    double value;
    if (smoothing == 0) {
      const double scale = g * wt;
      value = k == t ? scale * (prob - 1.0) : scale * prob;
    } else {
      // sum_k q_k = (1 - ls) w_t + (ls / C) W
      const double total_weight = weight_total ? *weight_total : static_cast<double>(v.c);
      const double total = (1 - smoothing) * wt + smoothing / v.c * total_weight;
      const double spread = smoothing / v.c;
      if (k == t) value = g * (total * prob - spread * wt - (1 - smoothing) * wt);
      else if (v.weight) value = g * (total * prob - spread * static_cast<double>(v.weight[k]));
      else value = g * (total * prob - spread);
    }
    grad_in[e] = static_cast<T>(value);
  }
}

// The weight total that label smoothing needs, in a float64 device buffer; undefined when
// there is no weight (the kernels then use C) or no smoothing.
template <class T>
Tensor weight_total(const ClassView<T>& v, double smoothing, Device device, cudaStream_t stream) {
  if (smoothing == 0 || !v.weight) return Tensor();
  Tensor total = empty({1}, TensorOptions(DType::Float64, device));
  weight_total_kernel<T><<<1, kThreads, 0, stream>>>(v.weight, v.c, static_cast<double*>(total.raw_data()));
  WEFT_CUDA_CHECK_LAUNCH("cross_entropy (class weight total)", stream);
  return total;
}

const double* data_or_null(const Tensor& t) { return t.defined() ? static_cast<const double*>(t.raw_data()) : nullptr; }

// --- mse_loss -------------------------------------------------------------------------------

template <class T>
__global__ void squared_error_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t n, T* __restrict__ out) {
  WEFT_FOR_EACH(i, n) {
    const T d = a[i] - b[i];
    out[i] = d * d;
  }
}

// Block s sums (a - b)^2 in float64 over elements [s * seg_len, (s + 1) * seg_len): thread
// t takes t, t + kThreads, ..., then the block's tree.
template <class T>
__global__ void __launch_bounds__(kThreads)
    squared_error_partial_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t n, int64_t seg_len,
                                 int64_t segments, double* __restrict__ partials) {
  __shared__ double scratch[kWarps + 1];
  auto plus = [](double x, double y) { return x + y; };
  for (int64_t s = blockIdx.x; s < segments; s += gridDim.x) {
    const int64_t end = std::min(n, (s + 1) * seg_len);
    double acc = 0;
#pragma unroll 4
    for (int64_t i = s * seg_len + threadIdx.x; i < end; i += kThreads) {
      const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
      acc += d * d;
    }
    acc = block_reduce<kThreads>(acc, 0.0, plus, scratch);
    if (threadIdx.x == 0) partials[s] = acc;
  }
}

// Folds the segment partials in a fixed order and stores the sum, or the mean over n.
template <class T>
__global__ void __launch_bounds__(kThreads)
    squared_error_total_kernel(const double* __restrict__ partials, int64_t segments, int64_t n, bool mean, T* out) {
  __shared__ double scratch[kWarps + 1];
  double acc = 0;
  for (int64_t s = threadIdx.x; s < segments; s += kThreads) acc += partials[s];
  acc = block_reduce<kThreads>(acc, 0.0, [](double x, double y) { return x + y; }, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<T>(mean ? acc / static_cast<double>(n) : acc);
}

template <class T>
__global__ void mse_backward_kernel(const T* __restrict__ grad, bool grad_is_scalar, const T* __restrict__ a,
                                    const T* __restrict__ b, T two_scale, int64_t n, T* __restrict__ grad_input,
                                    T* __restrict__ grad_target) {
  WEFT_FOR_EACH(i, n) {
    const T v = two_scale * (a[i] - b[i]) * grad[grad_is_scalar ? 0 : i];
    if (grad_input) grad_input[i] = v;
    if (grad_target) grad_target[i] = -v;
  }
}

// --- dispatch ---------------------------------------------------------------------------------

int64_t nll_loss_kernel(const Tensor& log_probs, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                        int64_t post, int64_t ignore_index, const Tensor& loss, const Tensor& target_weight) {
  const Device device = log_probs.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  FirstBad first_bad(device, stream);
  const int64_t positions = n * post;
  dispatch_floating(log_probs.dtype(), "nll_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    nll_forward_kernel<T><<<grid_size(positions), kThreads, 0, stream>>>(
        class_view<T>(target, weight, c, post, ignore_index), static_cast<const T*>(log_probs.raw_data()), positions,
        static_cast<T*>(loss.raw_data()),
        target_weight.defined() ? static_cast<T*>(target_weight.raw_data()) : nullptr, first_bad.data());
    WEFT_CUDA_CHECK_LAUNCH("nll_loss", stream);
  });
  first_bad.publish("nll_loss", target, c, ignore_index);
  return -1;  // a bad target is raised at the next synchronisation
}

void nll_loss_backward_kernel(const Tensor& grad, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                              int64_t post, int64_t ignore_index, const Tensor& grad_log_probs) {
  const Device device = grad_log_probs.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  const int64_t elements = n * c * post;
  dispatch_floating(grad_log_probs.dtype(), "nll_loss backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto launch = [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      nll_backward_kernel<T, I><<<grid_size(elements), kThreads, 0, stream>>>(
          class_view<T>(target, weight, c, post, ignore_index), static_cast<const T*>(grad.raw_data()),
          grad.numel() == 1, elements, static_cast<T*>(grad_log_probs.raw_data()));
      WEFT_CUDA_CHECK_LAUNCH("nll_loss_backward", stream);
    };
    if (elements <= kMaxUint32Index) launch(TypeTag<uint32_t>{});
    else launch(TypeTag<int64_t>{});
  });
}

int64_t cross_entropy_kernel(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                             int64_t post, int64_t ignore_index, double label_smoothing, const Tensor& loss,
                             const Tensor& target_weight, const Tensor& lse) {
  const Device device = logits.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  FirstBad first_bad(device, stream);
  const int64_t positions = n * post;
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ClassView<T> v = class_view<T>(target, weight, c, post, ignore_index);
    Tensor total = weight_total(v, label_smoothing, device, stream);
    const CrossEntropyForward<T> f{v,
                                   static_cast<const T*>(logits.raw_data()),
                                   label_smoothing,
                                   data_or_null(total),
                                   static_cast<T*>(loss.raw_data()),
                                   target_weight.defined() ? static_cast<T*>(target_weight.raw_data()) : nullptr,
                                   static_cast<double*>(lse.raw_data()),
                                   first_bad.data()};
    if (post > 1) {
      cross_entropy_columns_kernel<T><<<grid_size(positions), kThreads, 0, stream>>>(f, positions);
    } else if (c <= 16) {
      cross_entropy_rows_kernel<T, 4><<<grid_for(ceil_div(positions, kThreads / 4)), kThreads, 0, stream>>>(f, positions);
    } else if (c <= 2048) {
      cross_entropy_rows_kernel<T, kWarpSize><<<grid_for(ceil_div(positions, kWarps)), kThreads, 0, stream>>>(f, positions);
    } else {
      cross_entropy_rows_kernel<T, kThreads><<<grid_for(positions), kThreads, 0, stream>>>(f, positions);
    }
    WEFT_CUDA_CHECK_LAUNCH("cross_entropy", stream);
  });
  first_bad.publish("cross_entropy", target, c, ignore_index);
  return -1;  // a bad target is raised at the next synchronisation
}

void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target,
                                   const Tensor& weight, const Tensor& lse, int64_t n, int64_t c, int64_t post,
                                   int64_t ignore_index, double label_smoothing, const Tensor& grad_logits) {
  const Device device = grad_logits.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  const int64_t elements = n * c * post;
  dispatch_floating(logits.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ClassView<T> v = class_view<T>(target, weight, c, post, ignore_index);
    Tensor total = weight_total(v, label_smoothing, device, stream);
    auto launch = [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      cross_entropy_backward_kernel<T, I><<<grid_size(elements), kThreads, 0, stream>>>(
          v, static_cast<const T*>(grad.raw_data()), grad.numel() == 1, static_cast<const T*>(logits.raw_data()),
          static_cast<const double*>(lse.raw_data()), label_smoothing, data_or_null(total), elements,
          static_cast<T*>(grad_logits.raw_data()));
      WEFT_CUDA_CHECK_LAUNCH("cross_entropy_backward", stream);
    };
    if (elements <= kMaxUint32Index) launch(TypeTag<uint32_t>{});
    else launch(TypeTag<int64_t>{});
  });
}

void mse_loss_kernel(const Tensor& input, const Tensor& target, Reduction reduction, const Tensor& out) {
  const Device device = out.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  const int64_t n = input.numel();
  dispatch_floating(input.dtype(), "mse_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* a = static_cast<const T*>(input.raw_data());
    const T* b = static_cast<const T*>(target.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    if (reduction == Reduction::None) {
      if (n == 0) return;
      squared_error_kernel<T><<<grid_size(n), kThreads, 0, stream>>>(a, b, n, dst);
      WEFT_CUDA_CHECK_LAUNCH("mse_loss", stream);
      return;
    }
    // The segment length depends only on the dtype, so the summation order only on n.
    const int64_t seg_len = kSegmentBytes / static_cast<int64_t>(sizeof(T));
    const int64_t segments = ceil_div(n, seg_len);
    Tensor partials = empty({std::max<int64_t>(segments, 1)}, TensorOptions(DType::Float64, device));
    double* partial_data = static_cast<double*>(partials.raw_data());
    if (segments > 0) {
      squared_error_partial_kernel<T><<<grid_for(segments), kThreads, 0, stream>>>(a, b, n, seg_len, segments,
                                                                                   partial_data);
      WEFT_CUDA_CHECK_LAUNCH("mse_loss", stream);
    }
    squared_error_total_kernel<T><<<1, kThreads, 0, stream>>>(partial_data, segments, n, reduction == Reduction::Mean,
                                                              dst);
    WEFT_CUDA_CHECK_LAUNCH("mse_loss", stream);
  });
}

void mse_loss_backward_kernel(const Tensor& grad, const Tensor& input, const Tensor& target, double scale,
                              const Tensor& grad_input, const Tensor& grad_target) {
  const Device device = input.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  const int64_t n = input.numel();
  if (n == 0) return;
  dispatch_floating(input.dtype(), "mse_loss backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    mse_backward_kernel<T><<<grid_size(n), kThreads, 0, stream>>>(
        static_cast<const T*>(grad.raw_data()), grad.numel() == 1, static_cast<const T*>(input.raw_data()),
        static_cast<const T*>(target.raw_data()), static_cast<T>(2 * scale), n,
        grad_input.defined() ? static_cast<T*>(grad_input.raw_data()) : nullptr,
        grad_target.defined() ? static_cast<T*>(grad_target.raw_data()) : nullptr);
    WEFT_CUDA_CHECK_LAUNCH("mse_loss_backward", stream);
  });
}

#undef WEFT_FOR_EACH

}  // namespace

void register_loss_kernels() {
  nll_loss_stub.set(DeviceType::CUDA, &nll_loss_kernel);
  nll_loss_backward_stub.set(DeviceType::CUDA, &nll_loss_backward_kernel);
  cross_entropy_stub.set(DeviceType::CUDA, &cross_entropy_kernel);
  cross_entropy_backward_stub.set(DeviceType::CUDA, &cross_entropy_backward_kernel);
  mse_loss_stub.set(DeviceType::CUDA, &mse_loss_kernel);
  mse_loss_backward_stub.set(DeviceType::CUDA, &mse_loss_backward_kernel);
}

}  // namespace weft::cuda
