// The caching allocator's pool logic (see caching_allocator.h). Plain C++: no CUDA here.
#include "kernels/cuda/caching_allocator.h"

#include <algorithm>
#include <iostream>

#include "core/error.h"

namespace weft::cuda {

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<DeviceMemory> memory)
    : device_(device), memory_(std::move(memory)) {}

CachingAllocator::~CachingAllocator() {
  // Only tests destroy an allocator (the per-device ones live for the process): give
  // back what is free; a block still handed out would be a leak in the test.
  std::lock_guard lock(mutex_);
  std::set<Block*> waiting;
  for (const PendingFree& p : pending_) {
    memory_->release_event(p.event);
    waiting.insert(p.block);
  }
  for (Block* b : waiting) delete b;
  pending_.clear();
  for (auto* pool : {&free_small_, &free_large_}) {
    for (Block* b : *pool) {
      if (b->prev == nullptr && b->next == nullptr) memory_->raw_free(b->ptr);
      delete b;
    }
    pool->clear();
  }
  for (auto& [ptr, b] : allocated_) delete b;
}

size_t CachingAllocator::round_size(size_t nbytes) {
  return nbytes < kRound ? kRound : (nbytes + kRound - 1) / kRound * kRound;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kMidRequest) return kMidSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  {
    std::lock_guard lock(mutex_);
    if (void* ptr = try_allocate(nbytes)) return ptr;
  }
  // Note [Out of memory on a shared GPU]: the relief locks every allocator of the GPU,
  // this one included, one at a time, so it runs without this allocator's lock.
  const std::string relief = relief_ ? relief_() : "after synchronising and emptying its own cache (" +
                                                       format_bytes(synchronize_and_empty_cache()) + " given back)";
  std::lock_guard lock(mutex_);
  if (void* ptr = try_allocate(nbytes)) return ptr;
  fail_out_of_memory(nbytes, relief);
}

// A block for nbytes from the pools or a new segment; nullptr when the device refuses
// the segment even after this allocator's free segments went back to it.
void* CachingAllocator::try_allocate(size_t nbytes) {
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallRequest;
  process_pending();
  const StreamId stream = memory_->current_stream();
  Block* block = find_free(size, stream, small);
  if (block == nullptr) block = new_segment(size, stream, small);
  if (block == nullptr) return nullptr;
  block = split(block, size);
  block->allocated = true;
  block->requested = nbytes;
  allocated_.emplace(block->ptr, block);
  in_use_ += static_cast<int64_t>(nbytes);
  peak_ = std::max(peak_, in_use_);
  allocated_block_bytes_ += static_cast<int64_t>(block->size);
  ++live_;
  ++total_;
  return block->ptr;
}

CachingAllocator::Block* CachingAllocator::find_free(size_t size, StreamId stream, bool small) {
  auto& pool = small ? free_small_ : free_large_;
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, StreamId stream, bool small) {
  const size_t segment = segment_size(size);
  void* ptr = memory_->raw_allocate(segment);
  if (ptr == nullptr) {
    // Cached but unused segments may be what stands in the way: give them back, retry.
    release_free_segments();
    ptr = memory_->raw_allocate(segment);
  }
  if (ptr == nullptr) return nullptr;
  reserved_ += static_cast<int64_t>(segment);
  Block* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = segment;
  block->stream = stream;
  block->small = small;
  return block;
}

CachingAllocator::Block* CachingAllocator::split(Block* block, size_t size) {
  const size_t rest = block->size - size;
  // A small remainder is worth keeping from 512 bytes on; a large one only if it could
  // serve a request that the small pool would not (otherwise it fragments the segment).
  if (block->small ? rest < kRound : rest <= kSmallRequest) return block;
  Block* tail = new Block;
  tail->ptr = block->ptr + size;
  tail->size = rest;
  tail->stream = block->stream;
  tail->small = block->small;
  tail->prev = block;
  tail->next = block->next;
  if (block->next) block->next->prev = tail;
  block->next = tail;
  block->size = size;
  (block->small ? free_small_ : free_large_).insert(tail);
  return block;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) {
    std::cerr << "weft: CachingAllocator on " << device_ << ": free of unknown pointer " << ptr << " ignored\n";
    return;
  }
  Block* block = it->second;
  allocated_.erase(it);
  in_use_ -= static_cast<int64_t>(block->requested);
  allocated_block_bytes_ -= static_cast<int64_t>(block->size);
  --live_;
  block->allocated = false;
  block->requested = 0;
  // Note [Stream-ordered reuse]: the block's own stream needs nothing (its later work
  // runs after the work that used the block); every other stream that used it gets an
  // event, and the block waits in pending_ until all of them have completed.
  for (StreamId other : block->used_on) {
    try {
      pending_.push_back({memory_->record_event(other), block});
      ++block->pending_events;
    } catch (const std::exception& e) {
      std::cerr << "weft: CachingAllocator on " << device_ << ": could not record a stream event (" << e.what()
                << "); the block is not reused\n";
      ++block->pending_events;  // leak it rather than risk reuse while another stream reads it
    }
  }
  block->used_on.clear();
  if (block->pending_events == 0) free_block(block);
}

void CachingAllocator::free_block(Block* block) {
  auto& pool = block->small ? free_small_ : free_large_;
  auto mergeable = [](const Block* b) { return b != nullptr && !b->allocated && b->pending_events == 0; };
  if (mergeable(block->prev)) {
    Block* prev = block->prev;
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (mergeable(block->next)) {
    Block* next = block->next;
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
}

void CachingAllocator::process_pending() {
  auto done = std::stable_partition(pending_.begin(), pending_.end(),
                                    [&](const PendingFree& p) { return !memory_->event_done(p.event); });
  for (auto it = done; it != pending_.end(); ++it) {
    memory_->release_event(it->event);
    if (--it->block->pending_events == 0) free_block(it->block);
  }
  pending_.erase(done, pending_.end());
}

// Kernels queued on a block's own stream may still use a free block; cudaFree waits for
// the device to finish before it frees, so releasing a cached segment is always safe.
int64_t CachingAllocator::release_free_segments() {
  int64_t released = 0;
  for (auto* pool : {&free_small_, &free_large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {
        released += static_cast<int64_t>(b->size);
        it = pool->erase(it);
        release_segment(b);
      } else {
        ++it;
      }
    }
  }
  return released;
}

// `block` is a whole free segment, already out of its pool.
void CachingAllocator::release_segment(Block* block) {
  memory_->raw_free(block->ptr);
  reserved_ -= static_cast<int64_t>(block->size);
  delete block;
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = allocated_.find(ptr);
  WEFT_CHECK(it != allocated_.end(), "record_stream on ", device_, ": ", ptr,
             " is not the start of a block this allocator handed out");
  if (stream != it->second->stream) it->second->used_on.insert(stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  process_pending();
  release_free_segments();
}

int64_t CachingAllocator::synchronize_and_empty_cache() {
  std::lock_guard lock(mutex_);
  // After the device is idle every event has completed: blocks that waited for other
  // streams are free, and may complete a wholly free segment.
  memory_->synchronize_device();
  process_pending();
  return release_free_segments();
}

int64_t CachingAllocator::release_free_segment(void* ptr) {
  if (ptr == nullptr) return 0;
  std::lock_guard lock(mutex_);
  process_pending();
  for (auto* pool : {&free_small_, &free_large_}) {
    for (auto it = pool->begin(); it != pool->end(); ++it) {
      Block* b = *it;
      if (b->ptr != ptr) continue;
      if (b->prev != nullptr || b->next != nullptr) return 0;  // part of a segment in use
      const auto released = static_cast<int64_t>(b->size);
      pool->erase(it);
      release_segment(b);
      return released;
    }
  }
  return 0;
}

int64_t CachingAllocator::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return reserved_ - allocated_block_bytes_;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  AllocatorStats s;
  s.bytes_in_use = in_use_;
  s.peak_bytes_in_use = peak_;
  s.bytes_reserved = reserved_;
  s.num_allocations = live_;
  s.total_allocations = total_;
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  peak_ = in_use_;
}

void CachingAllocator::fail_out_of_memory(size_t nbytes, const std::string& relief) {
  const size_t segment = segment_size(round_size(nbytes));
  WEFT_FAIL("CUDA out of memory on ", device_, ": tried to allocate ", format_bytes(static_cast<int64_t>(nbytes)),
            " (a segment of ", format_bytes(static_cast<int64_t>(segment)), ") ", relief, "; ", device_, " has ",
            format_bytes(in_use_), " in use by tensors and ", format_bytes(reserved_ - allocated_block_bytes_),
            " cached by weft but not free for this request (fragments of segments in use); ",
            memory_->describe_capacity());
}

}  // namespace weft::cuda
