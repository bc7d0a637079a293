// The CUDA side of the device allocators (cudaMalloc, streams, events), the process's
// table of them, and the pinned host allocator.
#include "kernels/cuda/memory.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/allocator_table.h"
#include "kernels/cuda/caching_allocator.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/direct_allocator.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

// Tensors that outlive the CUDA runtime at exit (statics destroyed after it) are freed
// with the context anyway: the direct allocator's frees then have nothing left to do.
bool runtime_unloading() {
  int current = 0;
  if (cudaGetDevice(&current) != cudaErrorCudartUnloading) return false;
  cudaGetLastError();
  return true;
}

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(Device device) : device_(device), physical_(physical_device(device)) {}

  void* raw_allocate(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // out of memory is an answer here, not an error
      return nullptr;
    }
    WEFT_CUDA_CHECK(status);
    return ptr;
  }

  void raw_free(void* ptr) override {
    if (runtime_unloading()) return;
    DeviceGuard guard(device_);
    WEFT_CUDA_CHECK(cudaFree(ptr));
  }

  StreamId current_stream() override { return reinterpret_cast<StreamId>(current_native_stream(device_)); }

  EventId record_event(StreamId stream) override {
    DeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream)));
    return event;
  }

  bool event_done(EventId event) override {
    cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    WEFT_CUDA_CHECK(status);
    return true;
  }

  void release_event(EventId event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

  void synchronize_stream(StreamId stream) override {
    if (runtime_unloading()) return;
    DeviceGuard guard(device_);
    WEFT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  }

  void synchronize_device() override {
    DeviceGuard guard(device_);
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  std::string describe_capacity() override {
    DeviceGuard guard(device_);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      return "the GPU's capacity could not be read";
    }
    char text[128];
    std::snprintf(text, sizeof text, "GPU %d has %.2f GiB in all, %.2f GiB free", physical_,
                  static_cast<double>(total_bytes) / (1 << 30), static_cast<double>(free_bytes) / (1 << 30));
    return text;
  }

 private:
  Device device_;
  int physical_;
};

// WEFT_CUDA_ALLOCATOR, read when the first device allocator is made. A malformed value is
// an error at every CUDA allocation (a function-local static whose initialiser throws is
// tried again), never a silent default.
AllocatorKind process_allocator_kind() {
  static const AllocatorKind kind = [] {
    const AllocatorKind k = allocator_kind(std::getenv("WEFT_CUDA_ALLOCATOR"));
    if (k == AllocatorKind::Direct)
      std::cerr << "weft: CUDA: WEFT_CUDA_ALLOCATOR=direct: one cudaMalloc / cudaFree per block, no cache (slow; "
                   "meant for compute-sanitizer)\n";
    return k;
  }();
  return kind;
}

AllocatorTable& allocators() {
  // Never destroyed: tensors may outlive static teardown.
  static AllocatorTable* table = new AllocatorTable(
      [](Device device) -> std::unique_ptr<DeviceAllocator> {
        auto memory = std::make_unique<CudaDeviceMemory>(device);
        if (process_allocator_kind() == AllocatorKind::Direct)
          return std::make_unique<DirectAllocator>(device, std::move(memory));
        return std::make_unique<CachingAllocator>(device, std::move(memory));
      },
      [](Device device) { return physical_device(device); });
  return *table;
}

// Pinned host blocks are cached by their size rounded up to a power of two, which keeps
// the number of distinct sizes small for a data loader's repeating batch shapes.
class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t size = 512;
    while (size < nbytes) size *= 2;
    std::lock_guard lock(mutex_);
    reap_finished();
    void* ptr = nullptr;
    auto& cached = free_[size];
    if (!cached.empty()) {
      ptr = cached.back();
      cached.pop_back();
    } else {
      // The runtime needs a current device for its context; pinned memory is portable.
      cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
      if (status == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        WEFT_FAIL("out of pinned host memory: could not allocate ", nbytes, " bytes (", in_use_,
                  " bytes of pinned memory in use)");
      }
      WEFT_CUDA_CHECK(status);
      reserved_ += static_cast<int64_t>(size);
    }
    blocks_[ptr] = BlockInfo{size, nbytes, {}};
    in_use_ += static_cast<int64_t>(nbytes);
    peak_ = std::max(peak_, in_use_);
    ++live_;
    ++total_;
    return ptr;
  }

  void deallocate(void* ptr, size_t) noexcept override {
    if (ptr == nullptr) return;
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return;
    in_use_ -= static_cast<int64_t>(it->second.requested);
    --live_;
    if (it->second.events.empty()) {
      free_[it->second.size].push_back(ptr);
      blocks_.erase(it);
    } else {
      waiting_.push_back(ptr);  // an asynchronous copy may still read it
    }
  }

  void record_use(const void* ptr, const Stream& stream) {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(const_cast<void*>(ptr));
    if (it == blocks_.end()) return;
    DeviceGuard guard(stream.device());
    cudaEvent_t event = nullptr;
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventRecord(event, native(stream)));
    it->second.events.push_back(event);
  }

  bool owns(const void* ptr) const {
    std::lock_guard lock(mutex_);
    return blocks_.count(const_cast<void*>(ptr)) != 0;
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mutex_);
    return AllocatorStats{in_use_, peak_, reserved_, live_, total_};
  }
  void reset_peak() override {
    std::lock_guard lock(mutex_);
    peak_ = in_use_;
  }
  Device device() const override { return kCPU; }

 private:
  struct BlockInfo {
    size_t size;
    size_t requested;
    std::vector<cudaEvent_t> events;
  };

  // Blocks freed while copies were in flight return to the cache once those are done.
  void reap_finished() {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      BlockInfo& info = blocks_[*it];
      bool done = true;
      for (cudaEvent_t e : info.events) {
        cudaError_t status = cudaEventQuery(e);
        if (status == cudaErrorNotReady) {
          cudaGetLastError();
          done = false;
          break;
        }
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t e : info.events) cudaEventDestroy(e);
      free_[info.size].push_back(*it);
      blocks_.erase(*it);
      it = waiting_.erase(it);
    }
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, BlockInfo> blocks_;  // handed out, or waiting for their copies
  std::vector<void*> waiting_;
  std::map<size_t, std::vector<void*>> free_;
  int64_t in_use_ = 0, peak_ = 0, reserved_ = 0, live_ = 0, total_ = 0;
};

PinnedHostAllocator& pinned() {
  static PinnedHostAllocator* a = new PinnedHostAllocator;
  return *a;
}

}  // namespace

DeviceAllocator& device_allocator(Device device) { return allocators().get(device); }

void record_stream(const Tensor& t, const Stream& stream) {
  WEFT_CHECK(t.device().is_cuda(), "record_stream: expected a CUDA tensor, got one on ", t.device());
  // Events are recorded on the allocator's GPU: a stream of another logical device on the
  // same GPU is fine, one on another GPU is not.
  WEFT_CHECK(physical_device(stream.device()) == physical_device(t.device()), "record_stream: the stream belongs to ",
             stream.device(), " but the tensor lives on ", t.device(), ", on another GPU");
  device_allocator(t.device()).record_stream(t.storage()->data(), reinterpret_cast<StreamId>(stream.handle()));
}

void empty_cache(Device device) { device_allocator(device).empty_cache(); }

Allocator& pinned_host_allocator() { return pinned(); }
bool is_pinned(const void* ptr) { return ptr != nullptr && pinned().owns(ptr); }
void record_pinned_use(const void* ptr, const Stream& stream) { pinned().record_use(ptr, stream); }

}  // namespace weft::cuda
