// Streams and events on CPU devices: the same API as on CUDA (test_cuda_runtime repeats
// these on a GPU), with CPU semantics: work is done when it is queued, so an event is
// complete once recorded and waiting costs nothing; timed events measure host time.
#include "test_util.h"

#include <chrono>
#include <thread>

#include "core/stream.h"

using namespace weft;
using doctest::Contains;

TEST_CASE("each CPU device has a default, an upload and new streams; StreamGuard switches, nests and restores") {
  const Device d1("cpu:1"), d2("cpu:2");
  Stream s1 = default_stream(d1);
  CHECK(s1.device() == d1);
  CHECK(current_stream(d1) == s1);
  CHECK_FALSE(default_stream(d2) == s1);  // another device
  CHECK(default_stream(d2).device() == d2);
  Stream upload = upload_stream(d1), a = new_stream(d1), b = new_stream(d1);
  CHECK_FALSE(upload == s1);
  CHECK_FALSE(a == b);
  CHECK_FALSE(a == s1);
  {
    StreamGuard on_a(a);
    CHECK(current_stream(d1) == a);
    CHECK(current_stream(d2) == default_stream(d2));  // other devices keep theirs
    {
      StreamGuard on_b(b);
      CHECK(current_stream(d1) == b);
      StreamGuard on_d2(upload_stream(d2));
      CHECK(current_stream(d2) == upload_stream(d2));
    }
    CHECK(current_stream(d1) == a);
    CHECK(current_stream(d2) == default_stream(d2));
  }
  CHECK(current_stream(d1) == s1);
  CHECK(s1.query());
  s1.synchronize();
  synchronize(d1);
}

TEST_CASE("the current stream is per thread") {
  const Device d("cpu:3");
  Stream side = new_stream(d);
  StreamGuard guard(side);
  Stream seen_by_other(d, nullptr);
  std::thread([&] { seen_by_other = current_stream(d); }).join();
  CHECK(seen_by_other == default_stream(d));
  CHECK(current_stream(d) == side);
}

TEST_CASE("CPU events: complete once recorded, block without waiting, time host work") {
  const Device d("cpu:1");
  Event never;
  CHECK(never.query());  // nothing recorded: nothing to wait for
  never.synchronize();
  never.block(default_stream(d));
  CHECK_FALSE(never.recorded());

  Event start(true), stop(true);
  start.record(default_stream(d));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.record(new_stream(d));
  CHECK(start.recorded());
  CHECK(start.device() == d);
  CHECK(stop.query());
  stop.block(upload_stream(d));
  stop.synchronize();
  const float ms = start.elapsed_ms(stop);
  CHECK(ms >= 19.0f);
  CHECK(ms < 10000.0f);

  Event moved(std::move(stop));
  CHECK(moved.recorded());
  CHECK_FALSE(stop.recorded());  // NOLINT(bugprone-use-after-move): a moved-from event is empty
  CHECK(start.elapsed_ms(moved) == ms);

  Event untimed;
  untimed.record(default_stream(d));
  CHECK_THROWS_WITH_AS(start.elapsed_ms(untimed), Contains("both events must be created with timing and recorded"),
                       Error);
  CHECK_THROWS_WITH_AS(untimed.record(default_stream(Device("cpu:2"))),
                       Contains("the event was recorded on cpu:1 and cannot be recorded on cpu:2"), Error);
}

TEST_CASE("record_stream on a CPU tensor is accepted and changes nothing") {
  const Device d("cpu:1");
  Tensor t = ones({16}, TensorOptions(DType::Float32, d));
  record_stream(t, new_stream(d));
  CHECK(sum(t).item() == 16.0);
}
