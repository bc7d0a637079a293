// The trace recorder behind core/trace.h: per-thread buffers, and the Chrome JSON writer.
//
// Each thread that records appends to a buffer of its own, so spans on DataParallel's
// workers never wait for each other; the buffer's mutex is otherwise taken only by the
// writer. Buffers belong to the recorder, not to their threads, so the spans of a worker
// that has finished are still written; a thread's exit marks its buffer retired and the
// next start() drops it. Every event carries the number of the recording it belongs to:
// a span that began in one recording and ends in another, or an append that races with
// start(), is filtered out by that number instead of needing a lock on the hot path.
//
// Lanes are resolved only when the JSON is written: the events hold (device, stream
// handle) and the writer asks the device's backend which handle is its default stream.
// So are device spans' times: they hold their two timing events, and the writer reads them
// against an anchor per device (Note [Device time as host time]).
#include "core/trace.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

namespace weft::trace {

namespace detail {

std::atomic<uint32_t> recording{0};

struct OpenSpan {
  uint32_t recording;
  std::string name;
  std::string args;  // rendered JSON members: "key":value,...
  Device device;
  void* stream;
  int64_t begin_ns;
};

}  // namespace detail

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class Kind : uint8_t { Span, Instant, Counter, DeviceSpan };

struct Event {
  Kind kind;
  uint32_t recording;
  int thread = 0;  // the recording thread's number, set when appended
  Device device;
  void* stream;  // unused by counters
  int64_t begin_ns;
  int64_t end_ns;      // begin_ns for instants and counters
  double value = 0;    // counters
  std::string name;
  std::string args;
  // Device spans: the timing events around the work; begin_ns and end_ns come from them
  // when the JSON is written, which makes the event a Span.
  std::shared_ptr<const weft::Event> device_begin = nullptr, device_end = nullptr;
  bool device_timed = false;  // a device span, made a Span
};

struct ThreadBuffer {
  std::mutex mutex;
  std::vector<Event> events;
  int thread = 0;
  bool retired = false;
};

// Devices have no order of their own; lanes and rows sort by (type, index, handle).
using DeviceKey = std::pair<int, int>;
DeviceKey key_of(Device d) { return {static_cast<int>(d.type), d.index}; }
using LaneKey = std::pair<DeviceKey, uintptr_t>;
LaneKey key_of(Device d, void* stream) { return {key_of(d), reinterpret_cast<uintptr_t>(stream)}; }

struct Recorder {
  std::mutex mutex;  // guards the members; taken by start/stop/json and a thread's first record
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  uint32_t last = 0;     // the number of the last recording started
  int64_t epoch_ns = 0;  // when it started
  int next_thread = 0;
  std::map<LaneKey, std::string> lane_names;
};

// Never destroyed: threads may record, and thread-locals retire buffers, during exit.
Recorder& recorder() {
  static Recorder* r = new Recorder;
  return *r;
}

struct BufferHolder {
  std::shared_ptr<ThreadBuffer> buffer;
  ~BufferHolder() {
    if (!buffer) return;
    std::lock_guard lock(buffer->mutex);
    buffer->retired = true;
  }
};
thread_local BufferHolder this_thread_buffer;

void append(Event event) {
  if (!this_thread_buffer.buffer) {
    auto buffer = std::make_shared<ThreadBuffer>();
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    buffer->thread = r.next_thread++;
    r.buffers.push_back(buffer);
    this_thread_buffer.buffer = std::move(buffer);
  }
  ThreadBuffer& buffer = *this_thread_buffer.buffer;
  event.thread = buffer.thread;
  std::lock_guard lock(buffer.mutex);
  buffer.events.push_back(std::move(event));
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char code[8];
          std::snprintf(code, sizeof code, "\\u%04x", static_cast<unsigned>(c));
          out += code;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_member_key(std::string& args, std::string_view key) {
  if (!args.empty()) args += ',';
  append_json_string(args, key);
  args += ':';
}

void append_member(std::string& args, std::string_view key, int64_t value) {
  append_member_key(args, key);
  args += std::to_string(value);
}

// Microseconds with nanosecond digits: Chrome's unit, without float rounding.
void append_us(std::string& out, int64_t ns) {
  out += std::to_string(ns / 1000);
  out += '.';
  const std::string frac = std::to_string(ns % 1000);
  out.append(3 - frac.size(), '0');
  out += frac;
}

void append_double(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";  // JSON has no NaN or infinity
    return;
  }
  char digits[32];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, end);
}

// Chrome's process ids: one per device, in the order the rows are shown.
int pid_of(Device d) { return 1 + static_cast<int>(d.type) * 1000 + d.index; }

// Note [Device time as host time]: a device span's events were timed by the device's clock,
// which elapsed_ms() reads only as a difference between two events of that device (in float
// milliseconds, never negative here: CUDA does not promise negative differences). So the
// writer records one more timing event per device, on an idle stream of its own (it
// completes at once, after every span's events), waits for it and reads the host clock: the
// anchor's host time. A span begins at that time minus elapsed_ms(begin, anchor) and lasts
// elapsed_ms(begin, end). The duration is exact to the events' resolution (half a
// microsecond on CUDA); the placement also carries the float's rounding of the distance to
// the anchor (about 1 us for a span 10 s before the write, 60 us for one 10 minutes before:
// trace a few steps) and the wait's return. On CPU devices, whose timing events hold the
// host clock, only the rounding remains.
struct Anchor {
  weft::Event event{/*timing=*/true};
  int64_t host_ns = 0;
};

// How long the writer waits for an anchor (an idle stream's event: at once, unless the
// device's hardware queues are all taken by work that does not end).
constexpr std::chrono::seconds kAnchorBound{10};

Stream anchor_stream(Device device) {
  static std::mutex* mutex = new std::mutex;  // as the map: used during exit too
  static std::map<DeviceKey, Stream>* streams = new std::map<DeviceKey, Stream>;  // streams live for ever
  std::lock_guard lock(*mutex);
  auto it = streams->find(key_of(device));
  if (it == streams->end()) it = streams->emplace(key_of(device), new_stream(device)).first;
  return it->second;
}

int64_t ns_of_ms(float ms) { return static_cast<int64_t>(std::llround(double(ms) * 1e6)); }

// Gives device spans their host times and makes them spans; leaves out those whose events
// have not both happened yet, and those of a device whose anchor does not come within
// kAnchorBound (said on stderr).
void resolve_device_spans(std::vector<Event>& events) {
  std::map<DeviceKey, std::optional<Anchor>> anchors;
  auto anchor_of = [&](Device device) -> const std::optional<Anchor>& {
    auto it = anchors.find(key_of(device));
    if (it != anchors.end()) return it->second;
    std::optional<Anchor> anchor(std::in_place);
    anchor->event.record(anchor_stream(device));
    const auto deadline = std::chrono::steady_clock::now() + kAnchorBound;
    while (!anchor->event.query() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    anchor->host_ns = now_ns();
    if (!anchor->event.query()) {
      std::cerr << "weft: trace: " << device << " did not reach an event on an idle stream within "
                << kAnchorBound.count() << " s; its device spans are left out\n";
      anchor.reset();
    }
    return anchors.emplace(key_of(device), std::move(anchor)).first->second;
  };
  std::erase_if(events, [](const Event& e) {
    return e.kind == Kind::DeviceSpan && !(e.device_begin->query() && e.device_end->query());
  });
  std::erase_if(events, [&](Event& e) {
    if (e.kind != Kind::DeviceSpan) return false;
    const std::optional<Anchor>& anchor = anchor_of(e.device);
    if (!anchor) return true;
    e.begin_ns = anchor->host_ns - ns_of_ms(e.device_begin->elapsed_ms(anchor->event));
    e.end_ns = e.begin_ns + std::max<int64_t>(0, ns_of_ms(e.device_begin->elapsed_ms(*e.device_end)));
    e.kind = Kind::Span;
    e.device_timed = true;
    return false;
  });
}

struct Lane {
  int tid;
  std::string name;
};

// The lane of the stream `e` is on: its number and name.
Lane stream_lane(const Event& e, const std::map<LaneKey, std::string>& lane_names, std::map<DeviceKey, int>& others) {
  Lane lane;
  const auto named = lane_names.find(key_of(e.device, e.stream));
  // Asked only for devices that have spans, so their backends are already started.
  // (On CUDA, the first upload_stream() call makes that stream: a trace with an unnamed
  // stream lane, of a program that never used the upload stream, creates it here.)
  if (e.stream == default_stream(e.device).handle()) {
    lane = {1, "default stream"};
  } else if (named == lane_names.end() && e.stream == upload_stream(e.device).handle()) {
    lane = {2, "upload stream"};
  } else {
    const int k = ++others[key_of(e.device)];
    lane = {2 + k, "stream " + std::to_string(k)};
  }
  if (named != lane_names.end()) lane.name = named->second;
  return lane;
}

}  // namespace

namespace detail {

OpenSpan* open_span(uint32_t recording, std::string_view name, const Stream& stream) {
  auto* span = new OpenSpan{recording, std::string(name), {}, stream.device(), stream.handle(), 0};
  span->begin_ns = now_ns();  // last, so that the allocation is outside the span
  return span;
}

OpenSpan* open_span(uint32_t recording, std::string_view name, Device device) {
  return open_span(recording, name, current_stream(device));
}

void add_arg(OpenSpan* span, std::string_view key, int64_t value) {
  append_member(span->args, key, value);
}

void add_arg(OpenSpan* span, std::string_view key, std::string_view value) {
  append_member_key(span->args, key);
  append_json_string(span->args, value);
}

void close_span(OpenSpan* span) noexcept {
  const int64_t end_ns = now_ns();
  std::unique_ptr<OpenSpan> owned(span);
  if (recording.load(std::memory_order_relaxed) != span->recording) return;  // stopped, or another recording
  try {
    append(Event{Kind::Span, span->recording, 0, span->device, span->stream, span->begin_ns, end_ns, 0,
                 std::move(span->name), std::move(span->args)});
  } catch (...) {
    // Out of memory while tracing: this span is lost; a destructor does not throw.
  }
}

void record_instant(uint32_t recording, std::string_view name, Device device) {
  const Stream stream = current_stream(device);
  const int64_t t = now_ns();
  append(Event{Kind::Instant, recording, 0, device, stream.handle(), t, t, 0, std::string(name), {}});
}

void record_counter(uint32_t recording, std::string_view name, Device device, double value) {
  const int64_t t = now_ns();
  append(Event{Kind::Counter, recording, 0, device, nullptr, t, t, value, std::string(name), {}});
}

void record_device_span(uint32_t recording, std::string_view name, const Stream& stream,
                        std::shared_ptr<const weft::Event> begin, std::shared_ptr<const weft::Event> end,
                        std::initializer_list<std::pair<std::string_view, int64_t>> args) {
  WEFT_CHECK(begin && end && begin->timing() && end->timing() && begin->recorded() && end->recorded(),
             "trace::device_span '", name, "': both events must be created with timing (Event(true)) and recorded");
  WEFT_CHECK(begin->device() == stream.device() && end->device() == stream.device(), "trace::device_span '", name,
             "': the events were recorded on ", begin->device(), " and ", end->device(), ", the stream is on ",
             stream.device());
  std::string rendered;
  for (const auto& [key, value] : args) append_member(rendered, key, value);
  Event event{Kind::DeviceSpan, recording, 0, stream.device(), stream.handle(), 0, 0, 0, std::string(name),
              std::move(rendered)};
  event.device_begin = std::move(begin);
  event.device_end = std::move(end);
  append(std::move(event));
}

}  // namespace detail

void start() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  WEFT_CHECK(detail::recording.load(std::memory_order_relaxed) == 0,
             "trace::start: a recording is already running; call trace::stop() or trace::write() first");
  std::erase_if(r.buffers, [](const std::shared_ptr<ThreadBuffer>& buffer) {
    std::lock_guard buffer_lock(buffer->mutex);
    std::vector<Event>().swap(buffer->events);
    return buffer->retired;
  });
  r.last = r.last + 1 == 0 ? 1 : r.last + 1;  // 0 means "off"
  r.epoch_ns = now_ns();
  detail::recording.store(r.last, std::memory_order_release);
}

void stop() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  detail::recording.store(0, std::memory_order_release);
}

void name_lane(const Stream& stream, std::string name) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.lane_names[key_of(stream.device(), stream.handle())] = std::move(name);
}

std::string json() {
  std::vector<Event> events;
  int64_t epoch_ns;
  std::map<LaneKey, std::string> lane_names;
  {
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    epoch_ns = r.epoch_ns;
    lane_names = r.lane_names;
    for (const auto& buffer : r.buffers) {
      std::lock_guard buffer_lock(buffer->mutex);
      for (const Event& e : buffer->events)
        if (e.recording == r.last) events.push_back(e);
    }
  }
  resolve_device_spans(events);
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    // Outer spans before the spans they contain: by start, then longest first.
    return std::tuple(key_of(a.device), a.begin_ns, b.end_ns) < std::tuple(key_of(b.device), b.begin_ns, a.end_ns);
  });

  // Rows and lanes. Events are sorted by start, so "others" are numbered by first use. A
  // stream with host-timed and device-timed spans gets a second lane for the latter: the two
  // clocks' spans need not nest (a GPU runs a kernel after its host span has ended).
  std::set<LaneKey> host_timed;
  for (const Event& e : events)
    if (e.kind != Kind::Counter && !e.device_timed) host_timed.insert(key_of(e.device, e.stream));
  using LaneId = std::pair<LaneKey, bool>;  // the stream, and whether this is its device-time lane
  auto lane_id = [&](const Event& e) {
    const LaneKey key = key_of(e.device, e.stream);
    return LaneId{key, e.device_timed && host_timed.count(key) > 0};
  };
  std::map<DeviceKey, Device> devices;
  std::map<LaneId, Lane> lanes;
  std::map<DeviceKey, int> others;  // lanes other than the default and upload streams', per device
  for (const Event& e : events) {
    devices.emplace(key_of(e.device), e.device);
    if (e.kind == Kind::Counter) continue;
    const LaneKey key = key_of(e.device, e.stream);
    if (!lanes.count({key, false})) lanes.emplace(LaneId{key, false}, stream_lane(e, lane_names, others));
    const LaneId id = lane_id(e);
    if (lanes.count(id)) continue;
    const int k = ++others[key_of(e.device)];
    lanes.emplace(id, Lane{2 + k, lanes.at({key, false}).name + " (device time)"});
  }


  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":"
                    "\"host steady_clock; ts and dur in microseconds since trace::start()\"},\n\"traceEvents\":[";
  bool first = true;
  auto begin_event = [&](std::string_view ph, std::string_view name, int pid, int tid) {
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"ph\":\"";
    out += ph;
    out += "\",\"name\":";
    append_json_string(out, name);
    out += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid);
  };
  for (const auto& [key, device] : devices) {
    const int pid = pid_of(device);
    begin_event("M", "process_name", pid, 0);
    out += ",\"args\":{\"name\":";
    append_json_string(out, device.str());
    out += "}}";
    begin_event("M", "process_sort_index", pid, 0);
    out += ",\"args\":{\"sort_index\":" + std::to_string(pid) + "}}";
  }
  for (const auto& [key, lane] : lanes) {
    const int pid = pid_of(devices.at(key.first.first));
    begin_event("M", "thread_name", pid, lane.tid);
    out += ",\"args\":{\"name\":";
    append_json_string(out, lane.name);
    out += "}}";
    begin_event("M", "thread_sort_index", pid, lane.tid);
    out += ",\"args\":{\"sort_index\":" + std::to_string(lane.tid) + "}}";
  }
  for (const Event& e : events) {
    const int pid = pid_of(e.device);
    const int64_t ts = std::max<int64_t>(0, e.begin_ns - epoch_ns);
    if (e.kind == Kind::Counter) {
      begin_event("C", e.name, pid, 0);
      out += ",\"ts\":";
      append_us(out, ts);
      out += ",\"args\":{\"value\":";
      append_double(out, e.value);
      out += "}}";
      continue;
    }
    begin_event(e.kind == Kind::Span ? "X" : "i", e.name, pid, lanes.at(lane_id(e)).tid);
    out += ",\"ts\":";
    append_us(out, ts);
    if (e.kind == Kind::Span) {
      out += ",\"dur\":";
      append_us(out, std::max<int64_t>(0, e.end_ns - e.begin_ns));
    } else {
      out += ",\"s\":\"t\"";  // an instant on its lane
    }
    out += ",\"args\":{\"thread\":" + std::to_string(e.thread);
    if (!e.args.empty()) out += "," + e.args;
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

}  // namespace weft::trace

namespace weft {

void DeviceTraceSpan::start(uint32_t recording, std::string_view name, Device device) noexcept {
  try {
    if (device.is_cpu()) {
      host_.emplace(name, device);
      return;
    }
    recording_ = recording;
    name_ = name;
    stream_.emplace(current_stream(device));
    auto begin = std::make_shared<Event>(/*timing=*/true);
    begin->record(*stream_);
    begin_ = std::move(begin);
  } catch (...) {
    // Out of memory, or a device error, while tracing: this span is lost, the scope's work is not.
  }
}

void DeviceTraceSpan::finish() noexcept {
  // Stopped, or another recording started: the span belongs to neither (as TraceSpan's).
  if (trace::detail::recording.load(std::memory_order_relaxed) != recording_) return;
  try {
    auto end = std::make_shared<Event>(/*timing=*/true);
    end->record(*stream_);
    trace::detail::record_device_span(recording_, name_, *stream_, std::move(begin_), std::move(end), {});
  } catch (...) {
    // As in start().
  }
}

}  // namespace weft

namespace weft::trace {

void write(const std::string& path) {
  stop();
  AtomicFile file(path, "trace::write");
  file.write(json());
  file.commit();
}

}  // namespace weft::trace
