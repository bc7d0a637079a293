// Streams and events for every device type.
//
// A Stream is an ordered queue of work on one device; an Event marks a point in one, so
// that another stream (or the host) can wait for it. The parallel layer orders its work
// with these and nothing else: DevicePrefetcher's uploads, DDP's communication stream,
// Work handles and pipeline sends are written once and run unchanged on cpu:i and cuda:i.
//
// On a CUDA device a stream is a cudaStream_t and an event a cudaEvent_t (kernels/cuda
// registers them through core/device_backend.h). On a CPU device work runs synchronously
// on the host thread that issues it, so everything queued is already done: an event is
// complete as soon as it is recorded, waiting costs nothing, and elapsed_ms() measures
// host time between two records. CPU streams are still distinct values (the default
// stream, the upload stream, new ones), so code that switches streams runs the same.
//
// Each device has a default stream, where ops run unless a StreamGuard on this thread
// makes another one current; streams live as long as the process, as in PyTorch, so a
// Stream is a plain value. The current stream is thread-local: a worker thread starts on
// the default streams unless it is handed its parent's (core/thread_state.h).
#pragma once

#include <cstdint>
#include <iosfwd>

#include "core/device.h"

namespace weft {

class Tensor;

class Stream {
 public:
  Stream(Device device, void* handle) : device_(device), handle_(handle) {}
  Device device() const { return device_; }
  // The backend's handle (a cudaStream_t on CUDA; a small number on the CPU).
  void* handle() const { return handle_; }
  // Blocks the host until every piece of work queued on the stream so far is done.
  void synchronize() const;
  // True when every piece of work queued so far is done (never blocks).
  bool query() const;
  friend bool operator==(const Stream& a, const Stream& b) {
    return a.device_ == b.device_ && a.handle_ == b.handle_;
  }

 private:
  Device device_;
  void* handle_;
};

std::ostream& operator<<(std::ostream& out, const Stream& stream);

Stream default_stream(Device device);  // where ops run unless another stream is made current
Stream upload_stream(Device device);   // host-to-device copies that overlap compute (DevicePrefetcher)
Stream new_stream(Device device);      // one more stream (communication), alive until the process ends
// The stream this thread's ops on `device` run on: the one a StreamGuard set, else the default.
Stream current_stream(Device device);

// Makes `stream` the current stream of its device on this thread, for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Device device_;
};

// Waits for all work on every stream of the device (on CUDA: of its physical GPU).
void synchronize(Device device);

// t's memory is also used by work queued on `stream` (PyTorch's Tensor.record_stream): when
// t's storage is freed, its memory is not reused before that work is done. A no-op on the
// CPU, where that work is already done.
void record_stream(const Tensor& t, const Stream& stream);

// A point in a stream. Owns its backend handle (created at the first record, on that
// stream's device); movable, not copyable. An event never recorded is complete.
class Event {
 public:
  // With timing, elapsed_ms() can measure between two events (costs a little on CUDA).
  explicit Event(bool timing = false) : timing_(timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the work queued on `stream` so far; recording again moves the mark.
  void record(const Stream& stream);
  // Work queued on `stream` from now on starts after the recorded work (no host wait).
  // `stream` may belong to another device of the same type.
  void block(const Stream& stream) const;
  bool query() const;        // the recorded work is done
  void synchronize() const;  // the host waits for the recorded work
  // Milliseconds from this event to `end`; both created with timing and recorded.
  float elapsed_ms(const Event& end) const;

  bool recorded() const { return recorded_; }
  bool timing() const { return timing_; }
  Device device() const { return device_; }

 private:
  void release() noexcept;

  void* handle_ = nullptr;
  Device device_;
  bool timing_;
  bool recorded_ = false;
};

}  // namespace weft
