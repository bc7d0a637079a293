// The registry of device backends, and the CPU backend that core brings itself.
//
// CPU work runs synchronously on the host thread that issues it, so the CPU backend's
// streams are names and nothing more, and its events are complete once recorded (with
// timing, they remember the host time of the record).
#include "core/device_backend.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "core/error.h"

namespace weft {

namespace {

using Clock = std::chrono::steady_clock;

class CpuBackend final : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::CPU; }
  std::string start() override { return ""; }
  int device_count() override { return kMaxCpuDevices; }
  Allocator& allocator(Device device) override { return allocator_for(device); }
  void copy_with_host(const Tensor&, const Tensor&) override {
    WEFT_FAIL("internal error: a copy between host memory and a CPU device goes through copy_, not the backend");
  }

  // Handles: 0 the default stream, 1 the upload stream, then one number per new stream.
  void* default_stream(Device) override { return nullptr; }
  void* upload_stream(Device) override { return reinterpret_cast<void*>(uintptr_t{1}); }
  void* new_stream(Device) override { return reinterpret_cast<void*>(next_stream_.fetch_add(1)); }
  void synchronize_stream(Device, void*) override {}
  bool query_stream(Device, void*) override { return true; }
  void synchronize_device(Device) override {}

  // Only timed events need a handle: the host time of their last record.
  void* create_event(Device, bool timing) override { return timing ? new Clock::time_point() : nullptr; }
  void destroy_event(void* event) noexcept override { delete static_cast<Clock::time_point*>(event); }
  void record_event(void* event, Device, void*) override {
    if (event) *static_cast<Clock::time_point*>(event) = Clock::now();
  }
  void block_on_event(void*, Device, void*) override {}
  bool query_event(void*) override { return true; }
  void synchronize_event(void*) override {}
  float elapsed_ms(void* start, void* end) override {
    auto span = *static_cast<Clock::time_point*>(end) - *static_cast<Clock::time_point*>(start);
    return std::chrono::duration<float, std::milli>(span).count();
  }
  void record_stream(const Tensor&, Device, void*) override {}

 private:
  std::atomic<uintptr_t> next_stream_{2};
};

struct Registry {
  std::array<std::atomic<DeviceBackend*>, kNumDeviceTypes> registered{};
  std::array<std::atomic<DeviceBackend*>, kNumDeviceTypes> started{};
  std::array<std::once_flag, kNumDeviceTypes> start_once;
  std::array<std::string, kNumDeviceTypes> status;
};

// Made on first use, so backends may register from any static initialiser; never
// destroyed, since tensors (and their allocators) may outlive static teardown.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

const char* type_name(DeviceType type) { return type == DeviceType::CPU ? "CPU" : "CUDA"; }

}  // namespace

void register_device_backend(DeviceBackend& backend) {
  auto& slot = registry().registered[static_cast<int>(backend.type())];
  DeviceBackend* expected = nullptr;
  WEFT_CHECK(slot.compare_exchange_strong(expected, &backend), "register_device_backend: a ", type_name(backend.type()),
             " backend is registered already");
}

const std::string& device_backend_status(DeviceType type) {
  static CpuBackend cpu;
  Registry& r = registry();
  const int t = static_cast<int>(type);
  std::call_once(r.start_once[t], [&] {
    DeviceBackend* backend = type == DeviceType::CPU ? &cpu : r.registered[t].load();
    if (backend == nullptr) {
      r.status[t] = "weft was built without its CUDA backend (configure with -DWEFT_CUDA=ON on a machine with nvcc)";
      return;
    }
    r.status[t] = backend->start();
    if (r.status[t].empty()) r.started[t].store(backend, std::memory_order_release);
  });
  return r.status[t];
}

DeviceBackend& device_backend(Device device) {
  const int t = static_cast<int>(device.type);
  if (DeviceBackend* b = registry().started[t].load(std::memory_order_acquire)) [[likely]]
    return *b;
  const std::string& status = device_backend_status(device.type);
  WEFT_CHECK(status.empty(), "cannot use device ", device, ": ", status);
  return *registry().started[t].load(std::memory_order_acquire);
}

bool cuda_available() { return device_backend_status(DeviceType::CUDA).empty(); }

int cuda_device_count() { return cuda_available() ? device_backend(Device::cuda()).device_count() : 0; }
int cuda_physical_device_count() {
  return cuda_available() ? device_backend(Device::cuda()).physical_device_count() : 0;
}

const std::string& cuda_unavailable_reason() { return device_backend_status(DeviceType::CUDA); }

}  // namespace weft
