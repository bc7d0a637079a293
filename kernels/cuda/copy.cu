// CUDA copies: copy_ (strided, converting dtypes, across logical devices), fill_, and the
// host <-> device copies that core's Tensor::to / copy_ route here.
//
// Note [Copies across logical devices]: the copy runs on the destination's current
// stream after that stream has waited for an event recorded on the source's stream, and
// the source's stream then waits for the copy in turn. Both devices' later work is so
// ordered after the copy, with no host synchronisation, and the source's allocator may
// reuse the source's memory as soon as it is freed (its own stream runs after the read).
// Logical devices on one GPU read each other's memory directly; on different GPUs the
// bytes travel with cudaMemcpyPeerAsync between contiguous staging buffers.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <mutex>

#include "core/copy.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

int grid_size(int64_t n, int block) {
  // Resident threads per SM top out at 2048 on sm_80 / sm_90: 32 blocks of 256 per SM
  // is four full waves, enough to hide latency without launching idle blocks.
  static std::array<int, 64> sm_count{};
  static std::once_flag once[64];
  int device = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&device));
  WEFT_CHECK(device < 64, "grid_size: GPU ", device, " is beyond the 64 that weft supports");
  std::call_once(once[device], [&] {
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count[device], cudaDevAttrMultiProcessorCount, device));
  });
  int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{sm_count[device]} * 32)));
}

namespace {

// A named template around each device lambda: nvcc does not allow extended lambdas
// inside the generic lambdas that dispatch_dtype calls.
template <class To, class From>
void launch_convert(const StridedIndexer<2>& ix, int64_t n, cudaStream_t stream) {
  for_each_index("copy_", n, stream, [ix] __device__(int64_t i) {
    *reinterpret_cast<To*>(ix.pointer(0, i)) = convert<To>(*reinterpret_cast<const From*>(ix.pointer(1, i)));
  });
}

template <class T>
void launch_fill(const StridedIndexer<1>& ix, int64_t n, T value, cudaStream_t stream) {
  for_each_index("fill_", n, stream,
                 [ix, value] __device__(int64_t i) { *reinterpret_cast<T*>(ix.pointer(0, i)) = value; });
}

// Same device (or a logical device on the same GPU), dst's stream.
void copy_on_stream(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), static_cast<size_t>(dst.nbytes()),
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  auto ix = make_indexer<2>(dst.shape(), {&dst, &src});
  dispatch_storage_dtype(dst.dtype(), "copy_", [&](auto dst_tag) {
    using To = typename decltype(dst_tag)::type;
    dispatch_storage_dtype(src.dtype(), "copy_", [&](auto src_tag) {
      using From = typename decltype(src_tag)::type;
      launch_convert<To, From>(ix, dst.numel(), stream);
    });
  });
}

void copy_kernel(const Tensor& src, const Tensor& dst) {
  const Device from = src.device(), to = dst.device();
  if (from == to) {
    DeviceGuard guard(to);
    copy_on_stream(src, dst, stream_of(to));
    return;
  }
  // Note [Copies across logical devices].
  Stream src_stream = current_stream(from), dst_stream = current_stream(to);
  Event ready;
  ready.record(src_stream);
  ready.block(dst_stream);
  Tensor staged = src;  // freed only after the source stream has been ordered after the copy
  if (physical_device(from) == physical_device(to)) {
    DeviceGuard guard(to);
    copy_on_stream(src, dst, native(dst_stream));
  } else {
    if (!(src.is_contiguous() && src.dtype() == dst.dtype() && src.shape() == dst.shape())) {
      staged = empty(dst.shape(), TensorOptions(dst.dtype(), from));
      DeviceGuard guard(from);
      copy_on_stream(src, staged, native(src_stream));
      ready.record(src_stream);
      ready.block(dst_stream);
    }
    Tensor landed = dst.is_contiguous() ? dst : empty(dst.shape(), TensorOptions(dst.dtype(), to));
    DeviceGuard guard(to);
    WEFT_CUDA_CHECK(cudaMemcpyPeerAsync(landed.raw_data(), physical_device(to), staged.raw_data(),
                                        physical_device(from), static_cast<size_t>(landed.nbytes()),
                                        native(dst_stream)));
    if (!landed.is_same(dst)) copy_on_stream(landed, dst, native(dst_stream));
  }
  Event done;
  done.record(dst_stream);
  done.block(src_stream);
}

void fill_kernel(const Tensor& dst, double value) {
  DeviceGuard guard(dst.device());
  cudaStream_t stream = stream_of(dst.device());
  // All-zero bits are +0 in every dtype; -0.0 must keep its sign bit (as on the CPU).
  if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), 0, static_cast<size_t>(dst.nbytes()), stream));
    return;
  }
  auto ix = make_indexer<1>(dst.shape(), {&dst});
  dispatch_storage_dtype(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_fill<T>(ix, dst.numel(), convert<T>(value), stream);
  });
}

}  // namespace

// Host <-> device, both contiguous with one dtype and shape (core stages the rest).
void copy_with_host(const Tensor& src, const Tensor& dst) {
  const size_t nbytes = static_cast<size_t>(dst.nbytes());
  if (dst.device().is_cuda()) {
    DeviceGuard guard(dst.device());
    Stream stream = current_stream(dst.device());
    // From pinned memory the copy is asynchronous: the pinned allocator keeps the block
    // until the stream has read it. From pageable memory cudaMemcpyAsync returns once
    // the bytes are staged, so the host buffer may be freed right after.
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), nbytes, cudaMemcpyHostToDevice, native(stream)));
    if (src.is_pinned()) record_pinned_use(src.storage()->data(), stream);
  } else {
    DeviceGuard guard(src.device());
    Stream stream = current_stream(src.device());
    // Into pageable memory the copy waits inside the driver for what the stream has queued,
    // holding a lock of the driver that other threads' cudaEventCreate and cudaEventDestroy
    // need: an NCCL watchdog or a send's issuing thread would wait there while the main thread
    // waits so for a received header that needs that send (Note [Sends and receives on the
    // caller's thread] in parallel/process_group/process_group_nccl.cpp). So the stream is waited for
    // first, and the copy's call waits only for its own bytes.
    stream.synchronize();
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), nbytes, cudaMemcpyDeviceToHost, native(stream)));
    stream.synchronize();  // the host reads the values next
  }
}

void register_copy_kernels() {
  copy_stub.set(DeviceType::CUDA, &copy_kernel);
  fill_stub.set(DeviceType::CUDA, &fill_kernel);
}

}  // namespace weft::cuda
