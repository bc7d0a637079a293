// Launch helpers and strided indexing for CUDA kernels (CUDA-only header).
//
// Operands arrive as in the CPU loops (kernels/operands.h): byte strides broadcast to the
// output's shape, dims that are contiguous in every operand merged. A kernel then maps a
// linear output index to each operand's byte offset with StridedIndexer (a few integer
// divisions per element, only over the dims that survived merging), or, when every
// operand is one contiguous run, skips the indexer altogether. Grids are grid-stride
// loops capped at a multiple of the SM count: large tensors reuse warm blocks instead of
// launching millions of them.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "kernels/host_device_math.h"
#include "kernels/operands.h"

namespace weft::cuda {

constexpr int kMaxDims = 8;
constexpr int kBlockSize = 256;

// Byte offsets of N operands for a linear index of their common (merged) shape.
template <int N>
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
  char* data[N] = {};
  bool contiguous = false;  // one run in every operand: offset = linear * element stride

  __device__ __forceinline__ char* pointer(int i, int64_t linear) const {
    if (contiguous) return data[i] + linear * strides[i][0];
    int64_t offset = 0;
    for (int d = ndim - 1; d > 0; --d) {
      int64_t idx = linear % sizes[d];
      linear /= sizes[d];
      offset += idx * strides[i][d];
    }
    return data[i] + offset + linear * strides[i][0];
  }
};

template <int N>
StridedIndexer<N> make_indexer(const Shape& shape, const std::array<const Tensor*, N>& tensors) {
  Operands<N> ops = make_operands<N>(shape, tensors);
  coalesce(ops);
  StridedIndexer<N> ix;
  ix.ndim = static_cast<int>(ops.shape.size());
  for (int d = 0; d < ix.ndim; ++d) ix.sizes[d] = ops.shape[d];
  ix.contiguous = ix.ndim == 1;
  for (int i = 0; i < N; ++i) {
    ix.data[i] = ops.data[i];
    for (int d = 0; d < ix.ndim; ++d) ix.strides[i][d] = ops.strides[i][d];
  }
  return ix;
}

// Blocks for a grid-stride loop over n items: enough to fill the GPU several times over.
int grid_size(int64_t n, int block = kBlockSize);

template <class F>
__global__ void for_each_index_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

// Calls the device lambda f(i) for i in [0, n) on `stream`; checks the launch, naming
// `op` (the caller's op: this loop serves many). nvcc rejects an extended __device__
// lambda written inside a generic lambda (the callback of dispatch_dtype): put the lambda
// in a named function template and call that instead.
template <class F>
void for_each_index(const char* op, int64_t n, cudaStream_t stream, F f) {
  if (n <= 0) return;
  for_each_index_kernel<<<grid_size(n), kBlockSize, 0, stream>>>(n, f);
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
}

// The stream ops on `device` launch on (the current stream of this thread).
inline cudaStream_t stream_of(Device device) { return current_native_stream(device); }

// Casts between weft's dtypes, as the CPU casts (Note [Converting between dtypes]).
using hd::convert;

}  // namespace weft::cuda
