// Streams and events of logical CUDA devices.
//
// Every logical device has one compute stream (non-blocking, created on first use) that
// ops launch on unless a StreamGuard on this thread selects another, and one upload stream
// for host-to-device copies that overlap compute (DevicePrefetcher); communication gets
// its own streams from create_stream(). Work on different streams is ordered with events,
// never with host synchronisation (DESIGN.md, "Streams and memory").
// Streams are created once and live for the process, as in PyTorch: a Stream is a
// plain value that can be copied and compared.
#pragma once

#include <cuda_runtime_api.h>

#include "core/device.h"

namespace weft::cuda {

class Stream {
 public:
  Stream(Device device, cudaStream_t handle) : device_(device), handle_(handle) {}
  Device device() const { return device_; }
  cudaStream_t handle() const { return handle_; }
  void synchronize() const;
  bool query() const;  // true when all work queued so far has finished
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle_ == b.handle_; }

 private:
  Device device_;
  cudaStream_t handle_;
};

Stream compute_stream(Device device);  // the device's default stream for ops
Stream upload_stream(Device device);   // the device's stream for uploads that overlap compute
Stream current_stream(Device device);  // the guarded stream on this thread, else compute_stream
Stream create_stream(Device device);   // a new stream, alive until the process ends

// Makes `stream` the current stream of its device on this thread, for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Device device_;
  cudaStream_t previous_;
};

// A CUDA event (timing enabled on request). Owns its handle; movable, not copyable.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);  // created on the stream's GPU at the first record
  void block(const Stream& stream) const;  // `stream` waits for the recorded work (no host wait)
  bool query() const;
  void synchronize() const;
  float elapsed_ms(const Event& end) const;  // both recorded with timing = true
  cudaEvent_t handle() const { return handle_; }

 private:
  cudaEvent_t handle_ = nullptr;
  bool timing_;
};

}  // namespace weft::cuda
