// The CPU allocator and the per-device registry.
//
// Host memory is 64-byte aligned (one cache line, and wide enough for AVX-512 loads).
// Statistics are atomics because data-loader threads allocate concurrently with the
// training thread.
//
// Note [Host block cache]: glibc gives large freed blocks back to the kernel (munmap, or a
// trim of the heap's top), so a training step that frees its activations and asks for the
// same sizes in the next step faults every page in again, zeroed. On a ResNet DDP step with
// two CPU ranks that was a sixth of the step (docs/benchmarks.md, "Where a CPU DDP step goes"). So freed blocks of at
// least kCacheMin bytes are kept, up to kCacheCap bytes per device, and handed out again to
// a request of the same rounded size, which a step repeats; beyond the cap a block is freed.
// WEFT_CPU_ALLOCATOR=direct turns the cache off: tools/sanitize sets it, so that
// AddressSanitizer sees a use of a large block after its free.
#include "core/allocator.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/device_backend.h"
#include "core/error.h"

namespace weft {

namespace {

constexpr size_t kCacheMin = size_t{256} << 10;
constexpr size_t kCacheCap = size_t{1} << 30;

size_t round_to_line(size_t nbytes) { return (nbytes + 63) & ~size_t{63}; }

// WEFT_CPU_ALLOCATOR: unset or "caching", the block cache; "direct", none.
bool host_cache_from_env() {
  const char* v = std::getenv("WEFT_CPU_ALLOCATOR");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "caching") == 0) return true;
  WEFT_CHECK(std::strcmp(v, "direct") == 0, "WEFT_CPU_ALLOCATOR='", v, "': expected caching or direct");
  return false;
}

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator(int index, bool cache) : device_(DeviceType::CPU, index), cache_on_(cache) {}
  ~CpuAllocator() override { release_cache(); }

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = round_to_line(nbytes);
    void* ptr = take_cached(rounded);
    if (ptr == nullptr) ptr = std::aligned_alloc(64, rounded);
    if (ptr == nullptr && release_cache()) ptr = std::aligned_alloc(64, rounded);  // the cache given back first
    WEFT_CHECK(ptr != nullptr, "out of memory on ", device_, ": could not allocate ", nbytes, " bytes (",
               in_use_.load(), " bytes in use)");
    auto in_use = in_use_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
                  static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (in_use > peak && !peak_.compare_exchange_weak(peak, in_use, std::memory_order_relaxed)) {
    }
    live_.fetch_add(1, std::memory_order_relaxed);
    total_.fetch_add(1, std::memory_order_relaxed);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) noexcept override {
    if (ptr == nullptr) return;
    if (!keep(ptr, round_to_line(nbytes))) std::free(ptr);
    in_use_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    live_.fetch_sub(1, std::memory_order_relaxed);
  }

  AllocatorStats stats() const override {
    AllocatorStats s;
    s.bytes_in_use = in_use_.load();
    s.peak_bytes_in_use = peak_.load();
    {
      std::lock_guard lock(cache_mutex_);
      s.bytes_reserved = s.bytes_in_use + static_cast<int64_t>(cached_);
    }
    s.num_allocations = live_.load();
    s.total_allocations = total_.load();
    return s;
  }

  void reset_peak() override { peak_.store(in_use_.load()); }
  Device device() const override { return device_; }

 private:
  // A cached block of exactly `rounded` bytes, or nullptr.
  void* take_cached(size_t rounded) {
    if (!cache_on_ || rounded < kCacheMin) return nullptr;
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(rounded);
    if (it == cache_.end()) return nullptr;
    void* ptr = it->second;
    cache_.erase(it);
    cached_ -= rounded;
    return ptr;
  }
  // Frees every cached block; returns whether there was one.
  bool release_cache() {
    std::lock_guard lock(cache_mutex_);
    const bool any = !cache_.empty();
    for (auto& [size, ptr] : cache_) std::free(ptr);
    cache_.clear();
    cached_ = 0;
    return any;
  }
  // Whether the freed block went into the cache (else the caller frees it).
  bool keep(void* ptr, size_t rounded) noexcept {
    if (!cache_on_ || rounded < kCacheMin) return false;
    std::lock_guard lock(cache_mutex_);
    if (cached_ + rounded > kCacheCap) return false;
    try {
      cache_.emplace(rounded, ptr);
    } catch (...) {  // no memory for the map's node: free the block instead
      return false;
    }
    cached_ += rounded;
    return true;
  }

  Device device_;
  std::atomic<int64_t> in_use_{0}, peak_{0}, live_{0}, total_{0};
  const bool cache_on_;
  mutable std::mutex cache_mutex_;
  std::multimap<size_t, void*> cache_;  // rounded size -> block (Note [Host block cache])
  size_t cached_ = 0;
};

struct Registry {
  std::array<std::atomic<Allocator*>, kMaxCpuDevices> cpu{};
  std::mutex mutex;
  std::array<std::unique_ptr<CpuAllocator>, kMaxCpuDevices> owned_cpu;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: tensors may outlive static teardown
  return *r;
}

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) [[likely]] {
    Registry& r = registry();
    WEFT_CHECK(device.index >= 0 && device.index < kMaxCpuDevices, "invalid device ", device,
               ": logical CPU devices are cpu:0 .. cpu:", kMaxCpuDevices - 1);
    if (Allocator* a = r.cpu[device.index].load(std::memory_order_acquire)) [[likely]]
      return *a;
    std::lock_guard lock(r.mutex);
    if (!r.owned_cpu[device.index]) {
      r.owned_cpu[device.index] = std::make_unique<CpuAllocator>(device.index, host_cache_from_env());
      r.cpu[device.index].store(r.owned_cpu[device.index].get(), std::memory_order_release);
    }
    return *r.owned_cpu[device.index];
  }
  return device_backend(device).allocator(device);
}

Allocator* pinned_allocator() {
  if (!device_backend_status(DeviceType::CUDA).empty()) return nullptr;
  return device_backend(Device::cuda()).pinned_allocator();
}

AllocatorStats memory_stats(Device device) { return allocator_for(device).stats(); }
void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

}  // namespace weft
