// DirectAllocator: one exact-size device allocation per block, freed when the block is
// (WEFT_CUDA_ALLOCATOR=direct).
//
// The caching allocator hands out pieces of larger segments, so an overrun past a tensor's
// end lands in a neighbour or in cached memory, where compute-sanitizer's memcheck and
// initcheck cannot see it. This allocator asks the device for exactly the bytes requested
// (no 512-byte rounding, no splitting, no cache), the way PyTorch does under
// PYTORCH_NO_CUDA_MEMORY_CACHING: slow, and meant for sanitizer runs.
//
// Note [Direct frees are stream-safe]: a block freed on the host may still be read by
// kernels queued on its stream, and on other streams that record_stream named. Before the
// memory goes back to the device, deallocate waits for each of those streams: a use after
// that point is a real use-after-free, which memcheck then reports. (cudaFree also waits
// for the device, but weft does not lean on that undocumented detail.)
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "kernels/cuda/device_allocator.h"

namespace weft::cuda {

class DirectAllocator final : public DeviceAllocator {
 public:
  DirectAllocator(Device device, std::unique_ptr<DeviceMemory> memory);
  ~DirectAllocator() override;

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  Device device() const override { return device_; }

  void record_stream(void* ptr, StreamId stream) override;
  void empty_cache() override {}                                     // nothing is cached
  int64_t synchronize_and_empty_cache() override { return 0; }
  int64_t release_free_segment(void*) override { return 0; }
  int64_t cached_bytes() const override { return 0; }
  void set_out_of_memory_relief(OutOfMemoryRelief relief) override { relief_ = std::move(relief); }

 private:
  struct Block {
    size_t size = 0;
    StreamId stream = 0;          // the stream it was allocated on
    std::set<StreamId> used_on;   // other streams that used it (record_stream)
  };

  Device device_;
  std::unique_ptr<DeviceMemory> memory_;
  OutOfMemoryRelief relief_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  int64_t in_use_ = 0, peak_ = 0, live_ = 0, total_ = 0;
};

}  // namespace weft::cuda
