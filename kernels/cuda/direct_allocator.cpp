// The direct allocator (see direct_allocator.h). Plain C++: no CUDA here.
#include "kernels/cuda/direct_allocator.h"

#include <algorithm>
#include <iostream>

#include "core/error.h"

namespace weft::cuda {

DirectAllocator::DirectAllocator(Device device, std::unique_ptr<DeviceMemory> memory)
    : device_(device), memory_(std::move(memory)) {}

DirectAllocator::~DirectAllocator() {
  // Only tests destroy an allocator; a block still handed out would be a leak in the test.
  std::lock_guard lock(mutex_);
  for (auto& [ptr, block] : blocks_) memory_->raw_free(ptr);
}

void* DirectAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* ptr = memory_->raw_allocate(nbytes);
  std::string relief;
  if (ptr == nullptr) {
    // Nothing of this allocator is cached, but siblings on the same GPU may hold memory
    // (Note [Out of memory on a shared GPU]).
    relief = relief_ ? relief_() : "with no cache to empty";
    ptr = memory_->raw_allocate(nbytes);
  }
  std::lock_guard lock(mutex_);
  if (ptr == nullptr)
    WEFT_FAIL("CUDA out of memory on ", device_, ": tried to allocate ", format_bytes(static_cast<int64_t>(nbytes)),
              " (WEFT_CUDA_ALLOCATOR=direct: exact-size blocks, no cache) ", relief, "; ", device_, " has ",
              format_bytes(in_use_), " in use by tensors; ", memory_->describe_capacity());
  blocks_.emplace(ptr, Block{nbytes, memory_->current_stream(), {}});
  in_use_ += static_cast<int64_t>(nbytes);
  peak_ = std::max(peak_, in_use_);
  ++live_;
  ++total_;
  return ptr;
}

void DirectAllocator::deallocate(void* ptr, size_t) noexcept {
  if (ptr == nullptr) return;
  Block block;
  {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      std::cerr << "weft: DirectAllocator on " << device_ << ": free of unknown pointer " << ptr << " ignored\n";
      return;
    }
    block = std::move(it->second);
    blocks_.erase(it);
    in_use_ -= static_cast<int64_t>(block.size);
    --live_;
  }
  // Note [Direct frees are stream-safe]. Outside the lock: other threads allocate meanwhile.
  try {
    memory_->synchronize_stream(block.stream);
    for (StreamId other : block.used_on) memory_->synchronize_stream(other);
    memory_->raw_free(ptr);
  } catch (const std::exception& e) {
    // Leak it rather than free memory that a stream may still use.
    std::cerr << "weft: DirectAllocator on " << device_ << ": could not free a block of " << block.size
              << " bytes (" << e.what() << "); it is not given back\n";
  }
}

void DirectAllocator::record_stream(void* ptr, StreamId stream) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(ptr);
  WEFT_CHECK(it != blocks_.end(), "record_stream on ", device_, ": ", ptr,
             " is not the start of a block this allocator handed out");
  if (stream != it->second.stream) it->second.used_on.insert(stream);
}

AllocatorStats DirectAllocator::stats() const {
  std::lock_guard lock(mutex_);
  // Every byte held from the device is a byte handed out: reserved equals in use.
  return AllocatorStats{in_use_, peak_, in_use_, live_, total_};
}

void DirectAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  peak_ = in_use_;
}

}  // namespace weft::cuda
