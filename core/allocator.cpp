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
#include <string>

#include "core/error.h"

#ifdef WEFT_WITH_CUDA
namespace weft::cuda {
std::string start_backend();  // kernels/cuda/backend.cpp: "" or why no CUDA device can be used
}
#endif

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
  AllocatorFactory cuda_factory;
  Allocator* pinned = nullptr;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: tensors may outlive static teardown
  return *r;
}

// Why CUDA devices cannot be used ("" once the backend has started with a GPU). The
// backend is started on first need, once: it registers its allocators and kernels here
// and in the DispatchStubs (kernels/cuda/backend.h).
const std::string& cuda_backend_status() {
  static const std::string status = [] {
#ifdef WEFT_WITH_CUDA
    return cuda::start_backend();
#else
    return std::string("weft was built without its CUDA backend (configure with -DWEFT_CUDA=ON on a machine with nvcc)");
#endif
  }();
  return status;
}

}  // namespace

Allocator& allocator_for(Device device) {
  Registry& r = registry();
  if (device.is_cpu()) [[likely]] {
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
  const std::string& status = cuda_backend_status();
  AllocatorFactory factory;
  {
    std::lock_guard lock(r.mutex);
    factory = r.cuda_factory;
  }
  WEFT_CHECK(factory != nullptr, "cannot use device ", device, ": ", status);
  return factory(device);
}

void register_allocator_factory(DeviceType type, AllocatorFactory factory) {
  WEFT_CHECK(type == DeviceType::CUDA, "register_allocator_factory: only CUDA allocators are pluggable");
  std::lock_guard lock(registry().mutex);
  registry().cuda_factory = std::move(factory);
}

void register_pinned_allocator(Allocator* allocator) {
  std::lock_guard lock(registry().mutex);
  registry().pinned = allocator;
}

Allocator* pinned_allocator() {
  if (!cuda_backend_status().empty()) return nullptr;
  std::lock_guard lock(registry().mutex);
  return registry().pinned;
}

bool cuda_available() {
  if (!cuda_backend_status().empty()) return false;
  std::lock_guard lock(registry().mutex);
  return registry().cuda_factory != nullptr;
}

const std::string& cuda_unavailable_reason() { return cuda_backend_status(); }

AllocatorStats memory_stats(Device device) { return allocator_for(device).stats(); }
void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

}  // namespace weft
