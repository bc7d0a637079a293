// A process-wide recorder of what ran where and when, written as a Chrome trace.
//
// People who study parallel training want to see the schedule: which device scattered,
// replicated, ran forward and backward, when DDP's bucket all-reduces ran beside
// backward, how a pipeline's micro-batches interleave. Code marks that work with spans
// (TraceSpan), and trace::write() saves them in the Trace Event Format (JSON), which
// chrome://tracing and https://ui.perfetto.dev open: one row ("process") per device,
// named "cpu:1", "cuda:0", ordered cpu:0, cpu:1, ..., cuda:0, ...; within it one lane
// ("thread") per stream: "default stream", "upload stream", a name given with
// trace::name_lane(), or "stream <k>" (the k-th other stream seen on that device).
//
//   trace::start();
//   { TraceSpan span("forward", device); ... }          // the device's current stream
//   { TraceSpan span("all_reduce", comm_stream); span.arg("bytes", n); ... }
//   trace::write("run.trace.json");                     // stops, then writes the file
//
// Cost when off (the default): a span, an instant or a counter is one relaxed atomic
// load and a branch, and a span's destructor one more branch on its own pointer: no
// allocation, no lock, no clock read. Instrumenting hot paths is therefore free for
// runs that do not trace. When on, a span allocates its record, reads the clock twice
// and appends to a buffer of its own thread (a mutex that only the writer also takes),
// so spans from many threads at once (DataParallel's workers) do not contend. Every span
// of a recording is kept in memory until write(): trace a few steps, not a whole run.
//
// What the times mean: host time (std::chrono::steady_clock), in microseconds since
// trace::start(), at which the span's code began and ended on the host thread that ran
// it. On a CPU device that is when the work ran. On a GPU it is when the work was
// *issued*: kernel launches return at once, so a "forward" span on cuda:1 shows the host
// enqueueing the kernels, which may run later (Stream::synchronize() or an Event inside
// the span makes the span cover the GPU work too, at the cost of the overlap). Each span
// carries the host thread that ran it as its "thread" argument. A device span
// (trace::device_span) is the exception: two timing events bound it, so it shows when the
// device ran the work, in host time (NCCL's collectives are drawn so).
//
// Spans on one lane should nest, as they do when one host thread at a time issues work
// to a stream (the viewers draw a lane as a stack of properly nested slices). A span is
// recorded when it ends while its recording is still running: spans still open at
// trace::stop() are not written.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/device.h"
#include "core/stream.h"

namespace weft {

namespace trace {

namespace detail {

// The number of the recording in progress, 0 when none is: the one load on the off path.
extern std::atomic<uint32_t> recording;

struct OpenSpan;
OpenSpan* open_span(uint32_t recording, std::string_view name, const Stream& stream);
OpenSpan* open_span(uint32_t recording, std::string_view name, Device device);
void add_arg(OpenSpan* span, std::string_view key, int64_t value);
void add_arg(OpenSpan* span, std::string_view key, std::string_view value);
void close_span(OpenSpan* span) noexcept;
void record_instant(uint32_t recording, std::string_view name, Device device);
void record_counter(uint32_t recording, std::string_view name, Device device, double value);
void record_device_span(uint32_t recording, std::string_view name, const Stream& stream,
                        std::shared_ptr<const Event> begin, std::shared_ptr<const Event> end,
                        std::initializer_list<std::pair<std::string_view, int64_t>> args);

}  // namespace detail

// Whether a recording is running.
inline bool enabled() noexcept { return detail::recording.load(std::memory_order_relaxed) != 0; }

// Starts a new recording (times count from now) and discards the previous one. Throws
// if one is already running.
void start();
// Stops the recording; what it holds stays until the next start(). Does nothing when
// none is running.
void stop();
// Stops the recording and writes it to `path` as Chrome trace JSON, atomically (an
// AtomicFile: check_writable() there checks a --trace argument before the work). Throws
// weft::Error naming the path when it cannot be written; the recording is kept, so
// write() can be called again with another path.
void write(const std::string& path);
// The last recording as the JSON that write() would save (stop() it first).
std::string json();

// Names the lane of `stream` in traces ("communication", "stage 2 sends"); lanes of
// streams without a name are called "default stream", "upload stream" or "stream <k>".
// Streams live as long as the process (core/stream.h), and so do these names.
void name_lane(const Stream& stream, std::string name);

// A point in time on the lane of the device's current stream ("bucket 3 ready").
inline void instant(std::string_view name, Device device) {
  if (uint32_t r = detail::recording.load(std::memory_order_relaxed)) [[unlikely]]
    detail::record_instant(r, name, device);
}
// A value over time, drawn as a graph on the device's row ("bytes in use").
inline void counter(std::string_view name, Device device, double value) {
  if (uint32_t r = detail::recording.load(std::memory_order_relaxed)) [[unlikely]]
    detail::record_counter(r, name, device, value);
}
// Work as the device ran it, on the lane of `stream`: from `begin` to `end`, events created
// with timing (Event(true)) and recorded on `stream` around the work. Their times are read
// when the trace is written (json(), write()): there each device's clock is tied to the
// host's once (an event on an idle stream of its own, waited for, and the host's clock just
// after; Note [Device time as host time] in trace.cpp), and a span whose events have not
// both happened yet is left out, as a span still open at stop() is. The work is not waited
// for. Durations are exact; placements drift by the float rounding of their distance to the
// write, about 1 us at 10 s.
inline void device_span(std::string_view name, const Stream& stream, std::shared_ptr<const Event> begin,
                        std::shared_ptr<const Event> end,
                        std::initializer_list<std::pair<std::string_view, int64_t>> args = {}) {
  if (uint32_t r = detail::recording.load(std::memory_order_relaxed)) [[unlikely]]
    detail::record_device_span(r, name, stream, std::move(begin), std::move(end), args);
}

}  // namespace trace

// Marks the work done in its scope: begins where it is constructed, ends where it is
// destroyed. Neither copyable nor movable: a span is a scope.
class TraceSpan {
 public:
  // On the lane of the device's current stream on this thread (core/stream.h).
  TraceSpan(std::string_view name, Device device) {
    if (uint32_t r = trace::detail::recording.load(std::memory_order_relaxed)) [[unlikely]]
      open_ = trace::detail::open_span(r, name, device);
  }
  // On the lane of `stream` (a communication stream, a pipeline's send stream).
  TraceSpan(std::string_view name, const Stream& stream) {
    if (uint32_t r = trace::detail::recording.load(std::memory_order_relaxed)) [[unlikely]]
      open_ = trace::detail::open_span(r, name, stream);
  }
  ~TraceSpan() {
    if (open_) [[unlikely]]
      trace::detail::close_span(open_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  // A key/value shown with the span ("micro_batch", 3; "bytes", n); free when off.
  TraceSpan& arg(std::string_view key, int64_t value) {
    if (open_) [[unlikely]]
      trace::detail::add_arg(open_, key, value);
    return *this;
  }
  TraceSpan& arg(std::string_view key, std::string_view value) {
    if (open_) [[unlikely]]
      trace::detail::add_arg(open_, key, value);
    return *this;
  }

 private:
  trace::detail::OpenSpan* open_ = nullptr;
};

// The work queued on the device's current stream inside a scope, as the device ran it: a
// trace::device_span between a timing event recorded where it is constructed and one where
// it is destroyed. On a GPU that is when the kernels ran (a host TraceSpan shows when they
// were queued); on a CPU device, where the two are the same, it is a TraceSpan. A device
// error while tracing loses the span, never the work around it: neither end throws.
class DeviceTraceSpan {
 public:
  DeviceTraceSpan(std::string_view name, Device device) {
    if (uint32_t r = trace::detail::recording.load(std::memory_order_relaxed)) [[unlikely]]
      start(r, name, device);
  }
  ~DeviceTraceSpan() {
    if (begin_) [[unlikely]]
      finish();
  }
  DeviceTraceSpan(const DeviceTraceSpan&) = delete;
  DeviceTraceSpan& operator=(const DeviceTraceSpan&) = delete;

 private:
  void start(uint32_t recording, std::string_view name, Device device) noexcept;
  void finish() noexcept;

  std::optional<TraceSpan> host_;  // CPU devices
  uint32_t recording_ = 0;
  std::string name_;
  std::optional<Stream> stream_;
  std::shared_ptr<Event> begin_;
};

}  // namespace weft
