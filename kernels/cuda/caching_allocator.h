// CachingAllocator: the stream-ordered block cache behind every CUDA device.
//
// cudaMalloc and cudaFree are slow and synchronise the GPU, so freed blocks stay cached
// and are handed out again. Blocks live in pools keyed by the stream they were allocated
// on: work on one stream runs in order, so a block freed on stream S may be reused at
// once by the next allocation on S, even while kernels that used it are still queued. A
// block also used on another stream (record_stream) returns to its pool only after an
// event recorded on that stream at free time has completed (Note [Stream-ordered reuse]).
// Requests are rounded to 512 bytes; small ones (<= 1 MiB) are cut from 2 MiB segments,
// mid-sized ones from 20 MiB segments, large ones get their own segment rounded to
// 2 MiB; a cached block larger than needed is split and the remainder stays cached, and
// neighbours of one segment merge again when both are free.
//
// Out of memory, it empties its own cache and retries, then asks its relief (every
// allocator of the same GPU synchronised and emptied, Note [Out of memory on a shared GPU])
// and retries once more before it fails.
//
// The pool logic knows the device only through DeviceMemory (raw memory, streams,
// events), so it is plain C++ and tested on machines without a GPU with a fake device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/device_allocator.h"

namespace weft::cuda {

class CachingAllocator final : public DeviceAllocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;      // <= this: small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMidRequest = size_t{10} << 20;       // < this: 20 MiB segments
  static constexpr size_t kMidSegment = size_t{20} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;

  CachingAllocator(Device device, std::unique_ptr<DeviceMemory> memory);
  ~CachingAllocator() override;

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  Device device() const override { return device_; }

  void record_stream(void* ptr, StreamId stream) override;
  void empty_cache() override;
  int64_t synchronize_and_empty_cache() override;
  int64_t release_free_segment(void* ptr) override;
  int64_t cached_bytes() const override;
  void set_out_of_memory_relief(OutOfMemoryRelief relief) override { relief_ = std::move(relief); }

  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;          // bytes of this block (rounded)
    size_t requested = 0;     // bytes asked for, while allocated
    StreamId stream = 0;      // the pool it belongs to
    bool small = false;
    bool allocated = false;
    int pending_events = 0;   // events that must complete before the block is free
    std::set<StreamId> used_on;  // other streams that used it (record_stream)
    Block* prev = nullptr;    // neighbours within the same segment
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct PendingFree {
    EventId event;
    Block* block;
  };

  void* try_allocate(size_t nbytes);
  Block* find_free(size_t size, StreamId stream, bool small);
  Block* new_segment(size_t size, StreamId stream, bool small);
  Block* split(Block* block, size_t size);
  void free_block(Block* block);
  void process_pending();
  int64_t release_free_segments();
  void release_segment(Block* block);
  [[noreturn]] void fail_out_of_memory(size_t nbytes, const std::string& relief);

  Device device_;
  std::unique_ptr<DeviceMemory> memory_;
  OutOfMemoryRelief relief_;
  mutable std::mutex mutex_;
  std::set<Block*, BySize> free_small_, free_large_;
  std::unordered_map<void*, Block*> allocated_;
  std::vector<PendingFree> pending_;
  int64_t in_use_ = 0, peak_ = 0, reserved_ = 0, live_ = 0, total_ = 0, allocated_block_bytes_ = 0;
};

}  // namespace weft::cuda
