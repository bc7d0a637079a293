// CUDA dropout kernel: uniforms -> scaled mask (in place) and out = input * mask, in one
// pass over the three operands, by the mask rule the CPU uses too (kernels/dropout_mask.h)
// so that the same uniforms keep the same elements and give the same bits on both devices.
//
// The op is pure bandwidth (read mask and input, write mask and out), so the common case
// (contiguous, 16-byte aligned operands) moves 16-byte packets per thread; a strided
// input is read through StridedIndexer, its mask and out being contiguous by contract.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/dropout_kernels.h"
#include "kernels/dropout_mask.h"

namespace weft::cuda {

namespace {

constexpr int kPacketBytes = 16;

template <class T>
constexpr int kLanes = kPacketBytes / static_cast<int>(sizeof(T));

template <class T>
struct alignas(kPacketBytes) Packet {
  T lane[kLanes<T>];
};

template <class T>
__device__ __forceinline__ T drop(T& mask, T x, DropoutMask<T> rule) {
  const T keep = rule(mask);
  mask = keep;
  return x * keep;
}

template <class T>
__global__ void dropout_packet_kernel(int64_t n, const T* input, T* mask, T* out, DropoutMask<T> rule) {
  constexpr int kV = kLanes<T>;
  const int64_t packets = n / kV;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = first; k < packets; k += step) {
    const Packet<T> x = reinterpret_cast<const Packet<T>*>(input)[k];
    Packet<T> m = reinterpret_cast<const Packet<T>*>(mask)[k];
    Packet<T> o;
#pragma unroll
    for (int l = 0; l < kV; ++l) o.lane[l] = drop(m.lane[l], x.lane[l], rule);
    reinterpret_cast<Packet<T>*>(mask)[k] = m;
    reinterpret_cast<Packet<T>*>(out)[k] = o;
  }
  // The last n % kV elements (fewer than a block), one per thread.
  const int64_t i = packets * kV + first;
  if (i < n) out[i] = drop(mask[i], input[i], rule);
}

template <class T>
__global__ void dropout_strided_kernel(int64_t n, StridedIndexer<1> input, T* mask, T* out, DropoutMask<T> rule) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step)
    out[i] = drop(mask[i], *reinterpret_cast<const T*>(input.pointer(0, i)), rule);
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kPacketBytes == 0; }

template <class T>
void dropout_typed(const Tensor& input, const Tensor& mask, const Tensor& out, double p) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const DropoutMask<T> rule = DropoutMask<T>::for_probability(p);
  T* m = mask.data_ptr<T>();
  T* o = out.data_ptr<T>();
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  if (input.is_contiguous() && aligned(input.raw_data()) && aligned(m) && aligned(o)) {
    const int64_t packets = n / kLanes<T>;
    dropout_packet_kernel<T><<<grid_size(std::max<int64_t>(packets, 1)), kBlockSize, 0, stream>>>(
        n, static_cast<const T*>(input.raw_data()), m, o, rule);
  } else {
    const StridedIndexer<1> ix = make_indexer<1>(input.shape(), {&input});
    dropout_strided_kernel<T><<<grid_size(n), kBlockSize, 0, stream>>>(n, ix, m, o, rule);
  }
  WEFT_CUDA_CHECK_LAUNCH("dropout", stream);
}

void dropout_cuda(const Tensor& input, const Tensor& mask, const Tensor& out, double p) {
  dispatch_floating(input.dtype(), "dropout",
                    [&](auto tag) { dropout_typed<typename decltype(tag)::type>(input, mask, out, p); });
}

}  // namespace

void register_dropout_kernels() { dropout_stub.set(DeviceType::CUDA, &dropout_cuda); }

}  // namespace weft::cuda
