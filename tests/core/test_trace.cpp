// The Chrome trace recorder (core/trace.h): spans from several threads on several cpu:i
// devices land in the right rows and lanes, nested and timed from trace::start(); nothing
// is recorded while it is off; recordings restart; the file is valid JSON (parsed here
// with nlohmann-json) and an unwritable path is an error naming it. A suite to run under
// ThreadSanitizer too: the workers record while the main thread does.
#include "test_util.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/stream.h"
#include "core/trace.h"

using namespace weft;
using doctest::Contains;
using Json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A scratch directory of this test's own, removed at the end.
struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("weft_test_trace_" + std::to_string(::getpid()) + "_" + name)) {
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path(const std::string& file) const { return (dir / file).string(); }
};

Json read_trace(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return Json::parse(in);  // throws (and fails the test) on invalid JSON
}

// The events of one phase ("X", "M", ...), optionally of one name.
std::vector<Json> events(const Json& trace, const std::string& ph, const std::string& name = "") {
  std::vector<Json> out;
  for (const Json& e : trace.at("traceEvents"))
    if (e.at("ph") == ph && (name.empty() || e.at("name") == name)) out.push_back(e);
  return out;
}

// pid -> the value of a per-process metadata event (process_name: its name; sort index).
std::map<int, Json> process_metadata(const Json& trace, const std::string& name, const std::string& field) {
  std::map<int, Json> out;
  for (const Json& e : events(trace, "M", name)) out[e.at("pid").get<int>()] = e.at("args").at(field);
  return out;
}

// (pid, tid) -> the lane's name.
std::map<std::pair<int, int>, std::string> lane_names(const Json& trace) {
  std::map<std::pair<int, int>, std::string> out;
  for (const Json& e : events(trace, "M", "thread_name"))
    out[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name").get<std::string>();
  return out;
}

int pid_named(const Json& trace, const std::string& device) {
  for (const auto& [pid, name] : process_metadata(trace, "process_name", "name"))
    if (name == device) return pid;
  FAIL("no process row named ", device);
  return -1;
}

// Some host work, so that spans have a measurable length.
void busy(int iterations) {
  volatile double x = 1;
  for (int i = 0; i < iterations; ++i) x = x * 1.0000001 + 1e-9;
}

}  // namespace

TEST_CASE("off by default, spans, instants and counters record nothing; only spans inside a recording are written") {
  CHECK_FALSE(trace::enabled());
  {
    TraceSpan span("before", Device("cpu:1"));
    span.arg("bytes", 128).arg("kind", "ignored");
    trace::instant("before-instant", kCPU);
    trace::counter("before-counter", kCPU, 1.0);
  }
  Scratch scratch("off");
  trace::start();
  CHECK(trace::enabled());
  std::optional<TraceSpan> straddling;
  straddling.emplace("open at stop", kCPU);
  { TraceSpan span("inside", kCPU); }
  trace::stop();
  CHECK_FALSE(trace::enabled());
  straddling.reset();  // ends after stop(): not written
  { TraceSpan span("after", kCPU); }
  trace::write(scratch.path("t.json"));
  const Json trace = read_trace(scratch.path("t.json"));
  const auto spans = events(trace, "X");
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].at("name") == "inside");
  CHECK(events(trace, "i").empty());
  CHECK(events(trace, "C").empty());
}

TEST_CASE("spans from several threads on several cpu:i devices: a row per device, nested, timed from start") {
  Scratch scratch("threads");
  constexpr int kWorkers = 4, kSteps = 6;
  trace::start();
  {
    TraceSpan scatter("scatter", kCPU);
    busy(1000);
  }
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([w] {
      const Device device = Device::cpu(w + 1);
      for (int step = 0; step < kSteps; ++step) {
        TraceSpan outer("step", device);
        outer.arg("step", step);
        {
          TraceSpan inner("forward", device);
          busy(2000);
        }
        TraceSpan backward("backward", device);
        busy(2000);
      }
    });
  }
  for (int i = 0; i < 20; ++i) {  // the main thread records while the workers do
    TraceSpan span("poll", kCPU);
    busy(500);
  }
  for (auto& t : workers) t.join();
  trace::write(scratch.path("threads.json"));
  const Json trace = read_trace(scratch.path("threads.json"));

  // One row per device, named by it, ordered cpu:0, cpu:1, ...
  const auto names = process_metadata(trace, "process_name", "name");
  const auto sort = process_metadata(trace, "process_sort_index", "sort_index");
  CHECK(names.size() == kWorkers + 1);
  std::vector<std::pair<int, std::string>> by_sort;
  for (const auto& [pid, name] : names) {
    REQUIRE(sort.count(pid));
    by_sort.emplace_back(sort.at(pid).get<int>(), name.get<std::string>());
  }
  std::sort(by_sort.begin(), by_sort.end());
  for (int i = 0; i <= kWorkers; ++i) CHECK(by_sort[i].second == "cpu:" + std::to_string(i));

  CHECK(events(trace, "X", "scatter").size() == 1);
  CHECK(events(trace, "X", "poll").size() == 20);
  const auto lanes = lane_names(trace);
  std::set<int> worker_threads;
  for (int w = 0; w < kWorkers; ++w) {
    const int pid = pid_named(trace, "cpu:" + std::to_string(w + 1));
    std::vector<Json> steps, inner;
    for (const Json& e : events(trace, "X")) {
      if (e.at("pid") != pid) continue;
      CHECK(e.at("ts").get<double>() >= 0);
      CHECK(e.at("dur").get<double>() >= 0);
      CHECK(lanes.at({pid, e.at("tid").get<int>()}) == "default stream");
      worker_threads.insert(e.at("args").at("thread").get<int>());
      (e.at("name") == "step" ? steps : inner).push_back(e);
    }
    REQUIRE(steps.size() == kSteps);
    CHECK(inner.size() == 2 * kSteps);
    std::set<int64_t> step_args;
    for (const Json& s : steps) step_args.insert(s.at("args").at("step").get<int64_t>());
    CHECK(step_args.size() == kSteps);
    // Every forward / backward lies inside exactly one step of its lane (1 ns of slack for
    // the decimal microseconds).
    for (const Json& e : inner) {
      int containing = 0;
      const double begin = e.at("ts").get<double>(), end = begin + e.at("dur").get<double>();
      for (const Json& s : steps) {
        const double s_begin = s.at("ts").get<double>(), s_end = s_begin + s.at("dur").get<double>();
        if (s.at("tid") == e.at("tid") && s_begin <= begin + 1e-3 && end <= s_end + 1e-3) ++containing;
      }
      CHECK_MESSAGE(containing == 1, e.dump());
    }
  }
  CHECK(worker_threads.size() == kWorkers);  // each device's spans came from its own thread
}

TEST_CASE("a lane per stream: default, upload, new streams (numbered or named), and the current stream") {
  Scratch scratch("streams");
  const Device device("cpu:7");
  const Stream side = new_stream(device), comm = new_stream(device);
  trace::name_lane(comm, "communication");
  trace::start();
  { TraceSpan span("compute", device); }
  { TraceSpan span("upload", upload_stream(device)); }
  { TraceSpan span("side", side); }
  {
    StreamGuard guard(side);
    TraceSpan span("guarded", device);  // the device's current stream: side
  }
  {
    TraceSpan span("all_reduce", comm);
    span.arg("bytes", int64_t{1} << 40);
    trace::instant("bucket ready", device);
  }
  trace::counter("bytes in use", device, 4096);
  trace::write(scratch.path("streams.json"));
  const Json trace = read_trace(scratch.path("streams.json"));

  const int pid = pid_named(trace, "cpu:7");
  const auto lanes = lane_names(trace);
  auto lane_of = [&](const std::string& name) {
    const auto found = events(trace, "X", name);
    REQUIRE(found.size() == 1);
    CHECK(found[0].at("pid") == pid);
    return lanes.at({pid, found[0].at("tid").get<int>()});
  };
  CHECK(lane_of("compute") == "default stream");
  CHECK(lane_of("upload") == "upload stream");
  CHECK(lane_of("side") == "stream 1");
  CHECK(lane_of("guarded") == "stream 1");
  CHECK(lane_of("all_reduce") == "communication");
  CHECK(events(trace, "X", "all_reduce")[0].at("args").at("bytes").get<int64_t>() == int64_t{1} << 40);
  const auto instants = events(trace, "i", "bucket ready");
  REQUIRE(instants.size() == 1);
  CHECK(lanes.at({pid, instants[0].at("tid").get<int>()}) == "default stream");  // no guard: the default
  const auto counters = events(trace, "C", "bytes in use");
  REQUIRE(counters.size() == 1);
  CHECK(counters[0].at("pid") == pid);
  CHECK(counters[0].at("args").at("value").get<double>() == 4096);
  // Lanes are ordered default, upload, then the others.
  std::map<int, int> sort_of_tid;
  for (const Json& e : events(trace, "M", "thread_sort_index"))
    if (e.at("pid") == pid) sort_of_tid[e.at("tid").get<int>()] = e.at("args").at("sort_index").get<int>();
  std::vector<std::pair<int, std::string>> ordered;
  for (const auto& [tid, index] : sort_of_tid) ordered.emplace_back(index, lanes.at({pid, tid}));
  std::sort(ordered.begin(), ordered.end());
  REQUIRE(ordered.size() == 4);
  CHECK(ordered[0].second == "default stream");
  CHECK(ordered[1].second == "upload stream");
}

TEST_CASE("device spans: timed by their events, in host time, on their stream's lane; errors name what is wrong; DeviceTraceSpan") {
  // On CPU devices a timing event holds the host clock at its record, so a device span
  // recorded around some host work must land where a host span around the same work does.
  Scratch scratch("device_spans");
  const Device device("cpu:5");
  const Stream comm = new_stream(device);
  trace::name_lane(comm, "nccl");
  trace::start();
  auto begin = std::make_shared<Event>(/*timing=*/true), end = std::make_shared<Event>(/*timing=*/true);
  {
    TraceSpan host("host", comm);
    begin->record(comm);
    busy(3'000'000);
    end->record(comm);
  }
  trace::device_span("all_reduce", comm, begin, end, {{"bytes", 4096}});
  { DeviceTraceSpan on_cpu("device scope", device); }  // on a CPU device: a host span, on the current stream
  // A stream with device spans only keeps its lane's name.
  const Stream sends = new_stream(device);
  trace::name_lane(sends, "sends");
  auto sent_begin = std::make_shared<Event>(true), sent_end = std::make_shared<Event>(true);
  sent_begin->record(sends);
  sent_end->record(sends);
  trace::device_span("send", sends, sent_begin, sent_end);
  auto untimed = std::make_shared<Event>();
  untimed->record(comm);
  CHECK_THROWS_WITH_AS(trace::device_span("bad", comm, untimed, end), Contains("both events must be created with timing"),
                       Error);
  auto elsewhere = std::make_shared<Event>(true);
  elsewhere->record(default_stream(Device("cpu:6")));
  CHECK_THROWS_WITH_AS(trace::device_span("bad", comm, begin, elsewhere),
                       Contains("the events were recorded on cpu:5 and cpu:6, the stream is on cpu:5"), Error);
  CHECK_THROWS_WITH_AS(trace::device_span("bad", comm, begin, std::make_shared<Event>(true)),
                       Contains("both events must be created with timing (Event(true)) and recorded"), Error);
  trace::write(scratch.path("device_spans.json"));
  trace::device_span("after", comm, begin, end);  // the recording stopped: nothing
  const Json trace = read_trace(scratch.path("device_spans.json"));

  const auto device_spans = events(trace, "X", "all_reduce"), host_spans = events(trace, "X", "host");
  REQUIRE(device_spans.size() == 1);
  REQUIRE(host_spans.size() == 1);
  const Json& d = device_spans[0];
  const Json& h = host_spans[0];
  // Host-timed and device-timed spans of one stream need not nest: the latter get a lane of
  // their own beside it.
  const auto lanes = lane_names(trace);
  CHECK(d.at("pid") == h.at("pid"));
  CHECK(lanes.at({h.at("pid").get<int>(), h.at("tid").get<int>()}) == "nccl");
  CHECK(lanes.at({d.at("pid").get<int>(), d.at("tid").get<int>()}) == "nccl (device time)");
  const auto sent = events(trace, "X", "send");
  REQUIRE(sent.size() == 1);
  CHECK(lanes.at({sent[0].at("pid").get<int>(), sent[0].at("tid").get<int>()}) == "sends");
  CHECK(d.at("args").at("bytes").get<int64_t>() == 4096);
  const double d_begin = d.at("ts").get<double>(), d_end = d_begin + d.at("dur").get<double>();
  const double h_begin = h.at("ts").get<double>(), h_end = h_begin + h.at("dur").get<double>();
  CHECK(d.at("dur").get<double>() > 0.5 * h.at("dur").get<double>());
  // Within the host span, up to the float milliseconds elapsed_ms() returns (about 1 us here).
  CHECK(d_begin >= h_begin - 2);
  CHECK(d_end <= h_end + 2);
  CHECK(events(trace, "X", "bad").empty());
  CHECK(events(trace, "X", "after").empty());
  const auto scoped = events(trace, "X", "device scope");
  REQUIRE(scoped.size() == 1);
  CHECK(lanes.at({scoped[0].at("pid").get<int>(), scoped[0].at("tid").get<int>()}) == "default stream");
}

TEST_CASE("start and stop twice: each recording holds its own spans, timed from its own start") {
  Scratch scratch("twice");
  trace::start();
  CHECK_THROWS_WITH_AS(trace::start(), Contains("already running"), Error);
  { TraceSpan span("first", kCPU); }
  trace::stop();
  trace::stop();  // stopping again does nothing
  trace::write(scratch.path("first.json"));
  busy(200000);  // so that a second recording timed from the first start would show it
  trace::start();
  {
    TraceSpan span("second", kCPU);
    busy(1000);
  }
  trace::write(scratch.path("second.json"));
  trace::write(scratch.path("second.json"));  // over an existing file
  const Json first = read_trace(scratch.path("first.json")), second = read_trace(scratch.path("second.json"));
  REQUIRE(events(first, "X").size() == 1);
  CHECK(events(first, "X")[0].at("name") == "first");
  REQUIRE(events(second, "X").size() == 1);
  CHECK(events(second, "X")[0].at("name") == "second");
  const double first_ts = events(first, "X")[0].at("ts").get<double>();
  const double second_ts = events(second, "X")[0].at("ts").get<double>();
  CHECK(second_ts >= 0);
  CHECK(second_ts < 1e6);  // microseconds since the second start, well under a second
  CHECK(first_ts >= 0);
  // Nothing left behind but the two traces.
  CHECK(std::distance(fs::directory_iterator(scratch.dir), fs::directory_iterator()) == 2);
}

TEST_CASE("an unwritable path is an error naming it, from write(); the recording survives for another path") {
  Scratch scratch("unwritable");
  const std::string missing_dir = scratch.path("no_such_dir/trace.json");
  const std::string cannot = "cannot write '" + missing_dir + "'";

  trace::start();
  { TraceSpan span("kept", kCPU); }
  CHECK_THROWS_WITH_AS(trace::write(missing_dir), Contains(("trace::write: " + cannot).c_str()), Error);
  CHECK_FALSE(trace::enabled());  // write() stopped the recording before it failed
  trace::write(scratch.path("ok.json"));
  const Json trace = read_trace(scratch.path("ok.json"));
  REQUIRE(events(trace, "X").size() == 1);
  CHECK(events(trace, "X")[0].at("name") == "kept");
  CHECK(std::distance(fs::directory_iterator(scratch.dir), fs::directory_iterator()) == 1);
}

TEST_CASE("names and arguments are escaped: the file stays valid JSON") {
  Scratch scratch("escape");
  const std::string odd = "quote \" backslash \\ newline \n tab \t bell \x07 utf-8 \xc2\xb5s";
  trace::start();
  {
    TraceSpan span(odd, Device::cpu(2));
    span.arg(odd, odd).arg("negative", -5);
  }
  trace::counter("nan", Device::cpu(2), std::nan(""));
  trace::write(scratch.path("escape.json"));
  const Json trace = read_trace(scratch.path("escape.json"));
  const auto spans = events(trace, "X", odd);
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].at("args").at(odd) == odd);
  CHECK(spans[0].at("args").at("negative") == -5);
  CHECK(events(trace, "C", "nan")[0].at("args").at("value").is_null());
  CHECK(trace::json() == [&] {
    std::ifstream in(scratch.path("escape.json"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }());
}

TEST_CASE("threads that record while recordings start, stop and are written, and threads that exit between them") {
  Scratch scratch("race");
  std::atomic<bool> done{false};
  std::vector<std::thread> recorders;
  for (int w = 0; w < 3; ++w) {
    recorders.emplace_back([w, &done] {
      const Device device = Device::cpu(10 + w);
      while (!done.load()) {
        TraceSpan span("work", device);
        span.arg("worker", w);
        TraceSpan inner("inner", device);
        trace::counter("level", device, w);
      }
    });
  }
  for (int round = 0; round < 20; ++round) {
    trace::start();
    std::thread([round] { TraceSpan span("short-lived thread", Device::cpu(20)); span.arg("round", round); }).join();
    busy(5000);
    if (round % 2 == 0) {
      trace::write(scratch.path("race.json"));
      const Json trace = read_trace(scratch.path("race.json"));
      // The exited thread's span of this round is written; those of earlier rounds are not.
      const auto short_lived = events(trace, "X", "short-lived thread");
      REQUIRE(short_lived.size() == 1);
      CHECK(short_lived[0].at("args").at("round") == round);
    } else {
      trace::stop();
      CHECK(Json::parse(trace::json()).at("traceEvents").is_array());
    }
  }
  done = true;
  for (auto& t : recorders) t.join();
}
