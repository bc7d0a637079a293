// A fake GPU for the device allocators' tests: runs on every machine.
//
// FakeDevice hands out host memory up to a capacity and models streams and events
// explicitly: an event completes only when the test says its stream's work is done (or a
// synchronisation waits for it), so stream-ordered reuse and out-of-memory relief are
// tested deterministically. Several FakeDevices may share one FakeState: logical devices
// on one GPU, competing for its capacity.
#pragma once

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/device_allocator.h"

namespace weft::test {

using cuda::EventId;
using cuda::StreamId;

struct FakeState {
  std::recursive_mutex mutex;  // allocators of several logical devices may call from several threads
  size_t capacity = size_t{64} << 20;
  size_t used = 0;
  std::map<void*, size_t> live;
  StreamId stream = 1;
  int next_event = 1;
  std::map<int, StreamId> events;          // event -> stream it was recorded on
  std::set<StreamId> busy;                 // streams whose queued work is not done
  int released_events = 0;
  int raw_allocations = 0;
  std::vector<size_t> allocation_sizes;    // every raw_allocate that succeeded, in order
  std::vector<StreamId> synchronized_streams;
  int device_synchronizations = 0;
  std::set<StreamId> busy_at_free;         // streams still busy at some raw_free

  FakeState() = default;
  FakeState(const FakeState&) = delete;
  FakeState& operator=(const FakeState&) = delete;
  // The fake GPU's memory goes with it, as a real device's goes with the process: tests end
  // with blocks still handed out, which is no leak of the allocator's.
  ~FakeState() {
    for (const auto& entry : live) std::free(entry.first);
  }
};

class FakeDevice final : public cuda::DeviceMemory {
 public:
  explicit FakeDevice(FakeState& s, std::string name = "fake GPU") : s_(s), name_(std::move(name)) {}
  void* raw_allocate(size_t n) override {
    std::lock_guard lock(s_.mutex);
    if (s_.used + n > s_.capacity) return nullptr;
    void* p = std::malloc(n);
    s_.used += n;
    s_.live[p] = n;
    ++s_.raw_allocations;
    s_.allocation_sizes.push_back(n);
    return p;
  }
  void raw_free(void* p) override {
    std::lock_guard lock(s_.mutex);
    s_.busy_at_free.insert(s_.busy.begin(), s_.busy.end());
    s_.used -= s_.live.at(p);
    s_.live.erase(p);
    std::free(p);
  }
  StreamId current_stream() override {
    std::lock_guard lock(s_.mutex);
    return s_.stream;
  }
  EventId record_event(StreamId stream) override {
    std::lock_guard lock(s_.mutex);
    int id = s_.next_event++;
    s_.events[id] = stream;
    return reinterpret_cast<EventId>(static_cast<intptr_t>(id));
  }
  bool event_done(EventId e) override {
    std::lock_guard lock(s_.mutex);
    return s_.busy.count(s_.events.at(static_cast<int>(reinterpret_cast<intptr_t>(e)))) == 0;
  }
  void release_event(EventId) override {
    std::lock_guard lock(s_.mutex);
    ++s_.released_events;
  }
  void synchronize_stream(StreamId stream) override {
    std::lock_guard lock(s_.mutex);
    s_.busy.erase(stream);
    s_.synchronized_streams.push_back(stream);
  }
  void synchronize_device() override {
    std::lock_guard lock(s_.mutex);
    s_.busy.clear();
    ++s_.device_synchronizations;
  }
  std::string describe_capacity() override { return name_ + " with " + std::to_string(s_.capacity) + " bytes"; }

 private:
  FakeState& s_;
  std::string name_;
};

constexpr size_t MiB = size_t{1} << 20;

}  // namespace weft::test
