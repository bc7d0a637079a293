// CUDA multi-tensor kernels of the optimizers and of gradient clipping (contracts and
// update rules in kernels/optim_kernels.h; the CPU versions in kernels/cpu/optim.cpp).
//
// Note [Multi-tensor launches]: one launch updates a batch of tensors whose pointers,
// sizes and per-tensor scalars travel in the kernel's argument, a struct passed by value
// (at most 4 KiB with the op's scalars). Each tensor is cut into chunks of kChunk
// elements, one block per chunk; block b finds its tensor by a binary search in the
// batch's prefix sums of chunk counts (first_block), so the argument holds no per-block
// table and a batch is limited only by how many tensors fit: 53 for Adam (five lists),
// 93 for SGD, 153 for the norm and the scale. A longer list runs as consecutive launches
// on the same stream, each as full as the argument allows. (The alternative, a device
// table filled by a host copy, costs a copy per step and, from pageable memory, may block
// the host until the stream drains, i.e. until the backward pass is done.)
//
// Every element's update reads and writes only that element, by the rules the CPU uses
// too (kernels/optim_updates.h): in the tensors' dtype, with the multiply-adds fused
// explicitly, so the GPU equals a CPU build with FMA instructions bit for bit, and one
// without them to a rounding per multiply-add (Note [Fused multiply-add in shared
// formulas]). The norm is a deterministic two-stage reduction in float64: a fixed tree
// per chunk, then one block over the chunk partials in order, into a device buffer that
// the clipping kernel reads (no host synchronisation: kernels/optim_kernels.h).
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/optim_kernels.h"
#include "kernels/optim_updates.h"

namespace weft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 4096;  // elements per block: 16 per thread, and 256 blocks per million
constexpr size_t kMaxArgBytes = 4096;
constexpr size_t kOpArgBytes = 256;  // left in the argument for the op's scalars
constexpr int64_t kMaxGridBlocks = INT_MAX;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct NoExtra {};

// One launch's tensors (Note [Multi-tensor launches]): data[d][t] is tensor t of list d
// (nullptr for a list the step does not use), numel[t] > 0, first_block[t] the first
// block of tensor t, extra[t] its per-tensor scalars.
template <int Depth, class Extra>
struct TensorBatch {
  static constexpr int kCapacity = static_cast<int>(
      (kMaxArgBytes - kOpArgBytes - sizeof(int64_t)) / (Depth * sizeof(void*) + 2 * sizeof(int64_t) + sizeof(Extra)));
  void* data[Depth][kCapacity];
  int64_t numel[kCapacity];
  int64_t first_block[kCapacity];
  Extra extra[kCapacity];
  int count;
};

// The tensor that block `block` works on: the last t with first_block[t] <= block (no
// tensor is empty, so first_block strictly increases).
template <class Batch>
__device__ __forceinline__ int tensor_of_block(const Batch& batch, int64_t block) {
  int lo = 0, hi = batch.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (batch.first_block[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Runs launch(batch, blocks) over consecutive runs of the non-empty tensors of lists[0]
// (lists[d][i] is the i-th tensor of list d; an empty list gives nullptr), each run as
// long as one TensorBatch holds; extra_of(i) is tensor i's per-tensor value.
template <int Depth, class Extra, class ExtraOf, class Launch>
void for_each_batch(const std::array<const TensorList*, Depth>& lists, const ExtraOf& extra_of, const Launch& launch) {
  using Batch = TensorBatch<Depth, Extra>;
  Batch batch{};
  int64_t blocks = 0;
  const TensorList& first = *lists[0];
  for (size_t i = 0; i < first.size(); ++i) {
    const int64_t numel = first[i].numel();
    if (numel == 0) continue;
    const int64_t chunks = ceil_div(numel, kChunk);
    if (batch.count == Batch::kCapacity || (batch.count > 0 && blocks + chunks > kMaxGridBlocks)) {
      launch(batch, blocks);
      batch = Batch{};
      blocks = 0;
    }
    const int t = batch.count++;
    for (int d = 0; d < Depth; ++d) batch.data[d][t] = lists[d]->empty() ? nullptr : (*lists[d])[i].raw_data();
    batch.numel[t] = numel;
    batch.first_block[t] = blocks;
    batch.extra[t] = extra_of(i);
    blocks += chunks;
  }
  if (batch.count > 0) launch(batch, blocks);
}

// op(batch, t, begin, end) updates elements [begin, end) of tensor t, this thread taking
// begin + threadIdx.x, then every kThreads-th element.
template <class Batch, class Op>
__global__ void __launch_bounds__(kThreads) multi_tensor_apply(Batch batch, Op op) {
  const int t = tensor_of_block(batch, blockIdx.x);
  const int64_t begin = (blockIdx.x - batch.first_block[t]) * kChunk;
  const int64_t end = begin + kChunk < batch.numel[t] ? begin + kChunk : batch.numel[t];
  op(batch, t, begin + threadIdx.x, end);
}

// `name`: the op's name, for a launch failure.
template <class Batch, class Op>
void launch_apply(const char* name, const Batch& batch, int64_t blocks, const Op& op, cudaStream_t stream) {
  static_assert(sizeof(Batch) + sizeof(Op) <= kMaxArgBytes, "a multi-tensor launch argument exceeds 4 KiB");
  multi_tensor_apply<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(batch, op);
  WEFT_CUDA_CHECK_LAUNCH(name, stream);
}

// --- SGD ---------------------------------------------------------------------------

using SgdBatch = TensorBatch<3, uint8_t>;  // params, grads, momentum buffers; "buffer is new"

template <class T>
struct SgdUpdate {
  SgdRule<T> rule;

  __device__ void operator()(const SgdBatch& batch, int t, int64_t first, int64_t end) const {
    T* __restrict__ p = static_cast<T*>(batch.data[0][t]);
    const T* __restrict__ g = static_cast<const T*>(batch.data[1][t]);
    T* __restrict__ buf = static_cast<T*>(batch.data[2][t]);
    const bool fresh = batch.extra[t] != 0;
    for (int64_t i = first; i < end; i += kThreads) rule.step(p, g, buf, fresh, i);
  }
};

void sgd_step_kernel(const TensorList& params, const TensorList& grads, const TensorList& bufs,
                     const std::vector<uint8_t>& new_buffer, const SgdHyper& h) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].device());
  cudaStream_t stream = stream_of(params[0].device());
  const bool use_momentum = h.momentum != 0;
  dispatch_floating(params[0].dtype(), "SGD.step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const SgdUpdate<T> op{SgdRule<T>::from(h)};
    for_each_batch<3, uint8_t>(
        {&params, &grads, &bufs}, [&](size_t i) -> uint8_t { return use_momentum ? new_buffer[i] : 0; },
        [&](const SgdBatch& batch, int64_t blocks) { launch_apply("SGD.step", batch, blocks, op, stream); });
  });
}

// --- Adam / AdamW --------------------------------------------------------------------

// Each tensor's bias-correction terms travel in double; the kernel rounds them to T as
// the CPU does.
using AdamBatch = TensorBatch<5, AdamStepScalars>;  // params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq

template <class T>
struct AdamUpdate {
  AdamRule<T> rule;

  __device__ void operator()(const AdamBatch& batch, int t, int64_t first, int64_t end) const {
    T* __restrict__ p = static_cast<T*>(batch.data[0][t]);
    const T* __restrict__ g = static_cast<const T*>(batch.data[1][t]);
    T* __restrict__ m = static_cast<T*>(batch.data[2][t]);
    T* __restrict__ v = static_cast<T*>(batch.data[3][t]);
    T* __restrict__ v_max = static_cast<T*>(batch.data[4][t]);
    const T step_term = T(batch.extra[t].neg_step_size), bc2_sqrt = T(batch.extra[t].bias_correction2_sqrt);
    for (int64_t i = first; i < end; i += kThreads) rule.step(p, g, m, v, v_max, i, step_term, bc2_sqrt);
  }
};

void adam_step_kernel(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                      const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs,
                      const std::vector<int64_t>& steps, const AdamHyper& h) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].device());
  cudaStream_t stream = stream_of(params[0].device());
  auto scalars_of = [&](size_t i) { return AdamStepScalars::at(h, steps[i]); };
  dispatch_floating(params[0].dtype(), "Adam.step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const AdamUpdate<T> op{AdamRule<T>::from(h)};
    for_each_batch<5, AdamStepScalars>(
        {&params, &grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs}, scalars_of,
        [&](const AdamBatch& batch, int64_t blocks) { launch_apply("Adam.step", batch, blocks, op, stream); });
  });
}

// --- norm of a tensor list -----------------------------------------------------------

using PlainBatch = TensorBatch<1, NoExtra>;

enum class NormKind { Max, Abs, Square, Power };

// max with NaN winning, for the inf-norm (as the CPU's nan_max).
__device__ __forceinline__ double nan_max(double a, double b) { return (isnan(a) || a > b) ? a : b; }

template <NormKind kKind>
__device__ __forceinline__ double norm_fold(double a, double b) {
  if constexpr (kKind == NormKind::Max) return nan_max(a, b);
  else return a + b;
}

// The fold of every thread's value in a fixed tree (so the same on every run), valid in
// thread 0. blockDim.x == kThreads.
template <NormKind kKind>
__device__ double block_fold(double value) {
  __shared__ double warp_parts[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1)
    value = norm_fold<kKind>(value, __shfl_down_sync(0xffffffffu, value, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_parts[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kThreads / 32 ? warp_parts[lane] : 0.0;  // 0 is neutral for both folds (terms are >= 0)
    for (int offset = 16; offset > 0; offset >>= 1)
      value = norm_fold<kKind>(value, __shfl_down_sync(0xffffffffu, value, offset));
  }
  return value;
}

// One partial per block: the fold of its chunk's terms |x|^p (or |x| for the max).
template <class T, NormKind kKind>
__global__ void __launch_bounds__(kThreads) norm_partials(PlainBatch batch, double norm_type, double* partials) {
  const int t = tensor_of_block(batch, blockIdx.x);
  const int64_t begin = (blockIdx.x - batch.first_block[t]) * kChunk;
  const int64_t end = begin + kChunk < batch.numel[t] ? begin + kChunk : batch.numel[t];
  const T* __restrict__ x = static_cast<const T*>(batch.data[0][t]);
  double acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double value = static_cast<double>(x[i]);
    double term;
    if constexpr (kKind == NormKind::Square) term = value * value;
    else if constexpr (kKind == NormKind::Power) term = pow(fabs(value), norm_type);
    else term = fabs(value);
    acc = norm_fold<kKind>(acc, term);
  }
  acc = block_fold<kKind>(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

template <NormKind kKind>
__global__ void __launch_bounds__(kThreads) norm_final(const double* partials, int64_t count, double* result) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) acc = norm_fold<kKind>(acc, partials[i]);
  acc = block_fold<kKind>(acc);
  if (threadIdx.x == 0) *result = acc;
}

// One norm computation: the partials of every batch land side by side in `partials`
// (one per chunk of the whole list, `count` in all), then one block folds them into
// *result.
struct NormLaunch {
  const TensorList& tensors;
  double norm_type;
  double* partials;
  int64_t count;
  double* result;
  cudaStream_t stream;
};

template <class T, NormKind kKind>
void launch_norm(const NormLaunch& n) {
  static_assert(sizeof(PlainBatch) + sizeof(double) + sizeof(double*) <= kMaxArgBytes,
                "the norm's argument exceeds 4 KiB");
  int64_t offset = 0;
  for_each_batch<1, NoExtra>({&n.tensors}, [](size_t) { return NoExtra{}; },
                             [&](const PlainBatch& batch, int64_t blocks) {
                               norm_partials<T, kKind><<<static_cast<unsigned>(blocks), kThreads, 0, n.stream>>>(
                                   batch, n.norm_type, n.partials + offset);
                               WEFT_CUDA_CHECK_LAUNCH("clip_grad_norm_ (norm)", n.stream);
                               offset += blocks;
                             });
  norm_final<kKind><<<1, kThreads, 0, n.stream>>>(n.partials, n.count, n.result);
  WEFT_CUDA_CHECK_LAUNCH("clip_grad_norm_ (norm)", n.stream);
}

void norm_power_sum_kernel(const TensorList& tensors, double norm_type, const Tensor& out) {
  const Device device = out.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  int64_t chunks = 0;
  for (const Tensor& t : tensors) chunks += ceil_div(t.numel(), kChunk);
  if (chunks == 0) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, sizeof(double), stream));  // +0.0
    return;
  }
  Tensor partials_buffer = empty({chunks}, TensorOptions(DType::Float64, device));
  double* partials = static_cast<double*>(partials_buffer.raw_data());
  const NormLaunch launch{tensors, norm_type, partials, chunks, static_cast<double*>(out.raw_data()), stream};
  const NormKind kind = std::isinf(norm_type) ? NormKind::Max
                        : norm_type == 1      ? NormKind::Abs
                        : norm_type == 2      ? NormKind::Square
                                              : NormKind::Power;
  dispatch_floating(tensors[0].dtype(), "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (kind) {
      case NormKind::Max: launch_norm<T, NormKind::Max>(launch); break;
      case NormKind::Abs: launch_norm<T, NormKind::Abs>(launch); break;
      case NormKind::Square: launch_norm<T, NormKind::Square>(launch); break;
      case NormKind::Power: launch_norm<T, NormKind::Power>(launch); break;
    }
  });
}

// --- scale ---------------------------------------------------------------------------

// The factor is computed from the norm where it lies, by every thread (one division): no
// host round trip, and when there is nothing to clip, no gradient is read or written.
template <class T>
struct ClipScaleUpdate {
  const double* total_norm;
  double max_norm;

  __device__ void operator()(const PlainBatch& batch, int t, int64_t first, int64_t end) const {
    const double coef = clip_coefficient(*total_norm, max_norm);
    if (coef >= 1) return;  // a NaN factor is applied (clip_coefficient)
    const T factor = T(coef);
    T* __restrict__ x = static_cast<T*>(batch.data[0][t]);
    for (int64_t i = first; i < end; i += kThreads) x[i] = x[i] * factor;
  }
};

void clip_scale_kernel(const TensorList& tensors, const Tensor& total_norm, double max_norm) {
  if (tensors.empty()) return;
  DeviceGuard guard(tensors[0].device());
  cudaStream_t stream = stream_of(tensors[0].device());
  dispatch_floating(tensors[0].dtype(), "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ClipScaleUpdate<T> op{static_cast<const double*>(total_norm.raw_data()), max_norm};
    for_each_batch<1, NoExtra>({&tensors}, [](size_t) { return NoExtra{}; },
                               [&](const PlainBatch& batch, int64_t blocks) {
                                 launch_apply("clip_grad_norm_ (scale)", batch, blocks, op, stream);
                               });
  });
}

}  // namespace

void register_optim_kernels() {
  sgd_step_stub.set(DeviceType::CUDA, &sgd_step_kernel);
  adam_step_stub.set(DeviceType::CUDA, &adam_step_kernel);
  norm_power_sum_stub.set(DeviceType::CUDA, &norm_power_sum_kernel);
  clip_scale_stub.set(DeviceType::CUDA, &clip_scale_kernel);
}

}  // namespace weft::cuda
