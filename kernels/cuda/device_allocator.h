// What a CUDA device's allocator is, whichever kind the process uses, and what it needs
// from the device.
//
// Two kinds implement DeviceAllocator: CachingAllocator (the default: stream-ordered
// pools of cached segments) and DirectAllocator (WEFT_CUDA_ALLOCATOR=direct: one
// exact-size cudaMalloc / cudaFree per block, so that compute-sanitizer sees every
// overrun, as PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING). Both know the device only
// through DeviceMemory, so they are plain C++ and tested without a GPU on a fake device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/allocator.h"

namespace weft::cuda {

using StreamId = uintptr_t;  // a cudaStream_t as a number
using EventId = void*;

// What an allocator needs from a device.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* raw_allocate(size_t nbytes) = 0;  // nullptr when the device is out of memory
  virtual void raw_free(void* ptr) = 0;
  virtual StreamId current_stream() = 0;
  virtual EventId record_event(StreamId stream) = 0;  // completes when the stream's queued work has
  virtual bool event_done(EventId event) = 0;
  virtual void release_event(EventId event) = 0;
  virtual void synchronize_stream(StreamId stream) = 0;  // waits for the stream's queued work
  virtual void synchronize_device() = 0;                 // waits for every stream of the GPU
  virtual std::string describe_capacity() = 0;           // e.g. "GPU 0 has 79.1 GiB, 12.0 GiB free"
};

// Called by an allocator that the device refused even after it emptied its own cache:
// frees what can be freed on the whole GPU (Note [Out of memory on a shared GPU]) and
// says what it did and what is still held, for the error should the retry fail too.
using OutOfMemoryRelief = std::function<std::string()>;

class DeviceAllocator : public Allocator {
 public:
  // The block at ptr (as returned by allocate) is also used by work on `stream`: when it
  // is freed, it is reused (or given back) only after that work is done.
  virtual void record_stream(void* ptr, StreamId stream) = 0;
  // Gives every cached segment that is wholly free back to the device.
  virtual void empty_cache() = 0;
  // Waits for all work on the GPU, so that blocks waiting for other streams are free too,
  // then empties the cache. Returns the bytes given back.
  virtual int64_t synchronize_and_empty_cache() = 0;
  // If `ptr`, freed, starts a cached segment that is now wholly free, gives that segment
  // back (for one-off large blocks such as cuDNN's search workspace). Returns the bytes.
  virtual int64_t release_free_segment(void* ptr) = 0;
  // Bytes held from the device but not handed out (free blocks and blocks awaiting events).
  virtual int64_t cached_bytes() const = 0;
  // Installed once, before the allocator is first used (AllocatorTable does it); without
  // one, an allocator relieves only itself.
  virtual void set_out_of_memory_relief(OutOfMemoryRelief relief) = 0;
};

enum class AllocatorKind { Caching, Direct };

// The kind WEFT_CUDA_ALLOCATOR asks for (`value` nullptr or "": the caching allocator);
// anything but "caching" or "direct" throws weft::Error naming the variable.
AllocatorKind allocator_kind(const char* value);

// "1.50 MiB", "512 bytes": sizes in allocator messages.
std::string format_bytes(int64_t bytes);

}  // namespace weft::cuda
