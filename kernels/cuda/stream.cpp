// Compute and upload streams per logical device, the thread's current stream, and events.
#include "kernels/cuda/stream.h"

#include <array>
#include <atomic>
#include <mutex>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

cudaStream_t new_stream_handle(Device device) {
  DeviceGuard guard(device);
  cudaStream_t handle = nullptr;
  // Non-blocking: weft never uses the legacy default stream, so no implicit syncs with it.
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking));
  return handle;
}

// One stream per logical device, created on first use.
struct StreamTable {
  std::array<std::atomic<cudaStream_t>, kMaxLogicalDevices> handles{};
  std::mutex mutex;
};

// Streams outlive static teardown, as tensors may.
StreamTable& compute_streams() {
  static StreamTable* s = new StreamTable;
  return *s;
}

StreamTable& upload_streams() {
  static StreamTable* s = new StreamTable;
  return *s;
}

thread_local std::array<cudaStream_t, kMaxLogicalDevices> current_override{};

int slot(Device device) {
  physical_device(device);  // validates the logical index
  return device.index;
}

}  // namespace

void Stream::synchronize() const {
  DeviceGuard guard(device_);
  WEFT_CUDA_CHECK(cudaStreamSynchronize(handle_));
}

bool Stream::query() const {
  cudaError_t status = cudaStreamQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  WEFT_CUDA_CHECK(status);
  return true;
}

namespace {

Stream table_stream(StreamTable& s, Device device) {
  int i = slot(device);
  cudaStream_t handle = s.handles[i].load(std::memory_order_acquire);
  if (handle == nullptr) [[unlikely]] {
    std::lock_guard lock(s.mutex);
    handle = s.handles[i].load(std::memory_order_relaxed);
    if (handle == nullptr) {
      handle = new_stream_handle(device);
      s.handles[i].store(handle, std::memory_order_release);
    }
  }
  return Stream(device, handle);
}

}  // namespace

Stream compute_stream(Device device) { return table_stream(compute_streams(), device); }
Stream upload_stream(Device device) { return table_stream(upload_streams(), device); }

Stream current_stream(Device device) {
  int i = slot(device);
  if (cudaStream_t handle = current_override[i]) return Stream(device, handle);
  return compute_stream(device);
}

Stream create_stream(Device device) { return Stream(device, new_stream_handle(device)); }

StreamGuard::StreamGuard(Stream stream) : device_(stream.device()) {
  int i = slot(device_);
  previous_ = current_override[i];
  current_override[i] = stream.handle();
}

StreamGuard::~StreamGuard() { current_override[device_.index] = previous_; }

Event::Event(bool timing) : timing_(timing) {}

Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(handle_);
}

Event::Event(Event&& other) noexcept : handle_(other.handle_), timing_(other.timing_) { other.handle_ = nullptr; }

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cudaEventDestroy(handle_);
    handle_ = other.handle_;
    timing_ = other.timing_;
    other.handle_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  DeviceGuard guard(stream.device());
  if (handle_ == nullptr)
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventRecord(handle_, stream.handle()));
}

void Event::block(const Stream& stream) const {
  if (handle_ == nullptr) return;  // nothing recorded: nothing to wait for
  DeviceGuard guard(stream.device());
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream.handle(), handle_, 0));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  cudaError_t status = cudaEventQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  WEFT_CUDA_CHECK(status);
  return true;
}

void Event::synchronize() const {
  if (handle_ != nullptr) WEFT_CUDA_CHECK(cudaEventSynchronize(handle_));
}

float Event::elapsed_ms(const Event& end) const {
  WEFT_CHECK(timing_ && end.timing_ && handle_ != nullptr && end.handle_ != nullptr,
             "Event::elapsed_ms: both events must be created with timing and recorded");
  float ms = 0;
  WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_));
  return ms;
}

}  // namespace weft::cuda
