// Device memory of the CUDA backend: each logical device's allocator, the record_stream /
// empty_cache entry points, and the pinned host allocator.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/stream.h"

namespace weft::cuda {

// The allocator of a logical CUDA device, created on first use: one per logical device, also
// when several share a GPU (they relieve each other out of memory, allocator_table.h). A
// CachingAllocator, or a DirectAllocator under WEFT_CUDA_ALLOCATOR=direct (an unknown value
// is an error naming the variable).
DeviceAllocator& device_allocator(Device device);

// t's memory is also used by work queued on `stream` (PyTorch's Tensor.record_stream):
// when t's storage is freed, its block is not reused before that work is done. The
// stream may belong to another logical device on the same GPU.
void record_stream(const Tensor& t, const Stream& stream);

// Gives every wholly free cached segment of the device back to the GPU.
void empty_cache(Device device);

// Page-locked host memory, for host tensors that are copied to a GPU asynchronously.
// Blocks are cached by size; one freed after an asynchronous copy is reused only when
// the copy has finished (the copy records its stream, as record_stream does).
Allocator& pinned_host_allocator();
bool is_pinned(const void* ptr);
void record_pinned_use(const void* ptr, const Stream& stream);

}  // namespace weft::cuda
