// Allocator: where tensor bytes come from, with per-device accounting.
//
// Every device (cpu:i as well as cuda:i) has one allocator, and every allocator keeps the
// same statistics, so a test or a pipeline benchmark can assert "stage 2 peaked at N
// bytes" whatever the device. CUDA allocators come from the CUDA backend
// (core/device_backend.h); core/ knows nothing of CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace weft {

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // bytes handed out and not yet returned
  int64_t peak_bytes_in_use = 0;  // max of bytes_in_use since start or reset_peak()
  int64_t bytes_reserved = 0;     // bytes held from the system (>= in use for caching allocators)
  int64_t num_allocations = 0;    // allocations live now
  int64_t total_allocations = 0;  // allocations ever made
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least 64 bytes; nbytes == 0 returns nullptr.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual Device device() const = 0;
};

// The allocator of a logical device. Throws for a CUDA device whose backend cannot be
// used (built without CUDA, or no GPU visible), naming the reason.
Allocator& allocator_for(Device device);

// Page-locked host memory (its device is cpu:0), from the CUDA backend; nullptr when
// there is no usable GPU. Tensor::pin_memory() allocates from it.
Allocator* pinned_allocator();

AllocatorStats memory_stats(Device device);
void reset_peak_memory_stats(Device device);

}  // namespace weft
