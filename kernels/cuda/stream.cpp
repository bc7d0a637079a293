// Compute and upload streams per logical device, new streams, and events.
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

cudaStream_t table_stream(StreamTable& s, Device device) {
  physical_device(device);  // validates the logical index
  const int i = device.index;
  cudaStream_t handle = s.handles[i].load(std::memory_order_acquire);
  if (handle == nullptr) [[unlikely]] {
    std::lock_guard lock(s.mutex);
    handle = s.handles[i].load(std::memory_order_relaxed);
    if (handle == nullptr) {
      handle = new_stream_handle(device);
      s.handles[i].store(handle, std::memory_order_release);
    }
  }
  return handle;
}

// cudaErrorNotReady is an answer, not an error: it is cleared and reported as false.
bool done(cudaError_t status) {
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  WEFT_CUDA_CHECK(status);
  return true;
}

}  // namespace

cudaStream_t compute_stream_handle(Device device) { return table_stream(compute_streams(), device); }
cudaStream_t upload_stream_handle(Device device) { return table_stream(upload_streams(), device); }

cudaStream_t new_stream_handle(Device device) {
  DeviceGuard guard(device);
  cudaStream_t handle = nullptr;
  // Non-blocking: weft never uses the legacy default stream, so no implicit syncs with it.
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking));
  return handle;
}

void synchronize_stream(Device device, cudaStream_t stream) {
  DeviceGuard guard(device);
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

bool query_stream(cudaStream_t stream) { return done(cudaStreamQuery(stream)); }

cudaEvent_t create_event(Device device, bool timing) {
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

void destroy_event(cudaEvent_t event) noexcept { cudaEventDestroy(event); }

void record_event(cudaEvent_t event, Device device, cudaStream_t stream) {
  DeviceGuard guard(device);
  WEFT_CUDA_CHECK(cudaEventRecord(event, stream));
}

void block_on_event(cudaEvent_t event, Device device, cudaStream_t stream) {
  DeviceGuard guard(device);
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream, event, 0));
}

bool query_event(cudaEvent_t event) { return done(cudaEventQuery(event)); }

void synchronize_event(cudaEvent_t event) { WEFT_CUDA_CHECK(cudaEventSynchronize(event)); }

float elapsed_ms(cudaEvent_t start, cudaEvent_t end) {
  float ms = 0;
  WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  return ms;
}

}  // namespace weft::cuda
