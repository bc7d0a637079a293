// The CPU allocator and the per-device registry.
//
// Host memory is 64-byte aligned (one cache line, and wide enough for AVX-512 loads).
// Statistics are atomics because data-loader threads allocate concurrently with the
// training thread.
#include "core/allocator.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/device_backend.h"
#include "core/error.h"

namespace weft {

namespace {

class CpuAllocator final : public Allocator {
 public:
  explicit CpuAllocator(int index) : device_(DeviceType::CPU, index) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) & ~size_t{63};
    void* ptr = std::aligned_alloc(64, rounded);
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
    std::free(ptr);
    in_use_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    live_.fetch_sub(1, std::memory_order_relaxed);
  }

  AllocatorStats stats() const override {
    AllocatorStats s;
    s.bytes_in_use = in_use_.load();
    s.peak_bytes_in_use = peak_.load();
    s.bytes_reserved = s.bytes_in_use;
    s.num_allocations = live_.load();
    s.total_allocations = total_.load();
    return s;
  }

  void reset_peak() override { peak_.store(in_use_.load()); }
  Device device() const override { return device_; }

 private:
  Device device_;
  std::atomic<int64_t> in_use_{0}, peak_{0}, live_{0}, total_{0};
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
      r.owned_cpu[device.index] = std::make_unique<CpuAllocator>(device.index);
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
