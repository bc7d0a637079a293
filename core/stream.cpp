// Streams and events: the device-generic side; the backends do the work.
#include "core/stream.h"

#include <algorithm>
#include <ostream>
#include <utility>

#include "core/device_backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_state.h"

namespace weft {

namespace {

// The streams StreamGuards made current on this thread, innermost last. Usually empty, so
// current_stream() costs a length check and the backend's table lookup.
thread_local StreamOverrides stream_overrides;

}  // namespace

StreamOverrides& this_thread_stream_overrides() { return stream_overrides; }

void Stream::synchronize() const { device_backend(device_).synchronize_stream(device_, handle_); }
bool Stream::query() const { return device_backend(device_).query_stream(device_, handle_); }

std::ostream& operator<<(std::ostream& out, const Stream& stream) {
  return out << "stream " << stream.handle() << " on " << stream.device();
}

Stream default_stream(Device device) { return Stream(device, device_backend(device).default_stream(device)); }
Stream upload_stream(Device device) { return Stream(device, device_backend(device).upload_stream(device)); }
Stream new_stream(Device device) { return Stream(device, device_backend(device).new_stream(device)); }

Stream current_stream(Device device) {
  for (auto it = stream_overrides.rbegin(); it != stream_overrides.rend(); ++it)
    if (it->first == device) return Stream(device, it->second);
  return default_stream(device);
}

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()) {
  stream_overrides.emplace_back(stream.device(), stream.handle());
}

StreamGuard::~StreamGuard() {
  // Guards nest, so the innermost entry for this device is this guard's.
  auto it = std::find_if(stream_overrides.rbegin(), stream_overrides.rend(),
                         [&](const auto& entry) { return entry.first == device_; });
  if (it != stream_overrides.rend()) stream_overrides.erase(std::next(it).base());
}

void synchronize(Device device) { device_backend(device).synchronize_device(device); }

void record_stream(const Tensor& t, const Stream& stream) {
  WEFT_CHECK(t.device().type == stream.device().type, "record_stream: the tensor lives on ", t.device(),
             " but the stream belongs to ", stream.device());
  device_backend(stream.device()).record_stream(t, stream.device(), stream.handle());
}

// --- Event ---------------------------------------------------------------------------

Event::~Event() { release(); }

void Event::release() noexcept {
  if (handle_ != nullptr) device_backend(device_).destroy_event(handle_);
  handle_ = nullptr;
}

Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      device_(other.device_),
      timing_(other.timing_),
      recorded_(std::exchange(other.recorded_, false)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    release();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    timing_ = other.timing_;
    recorded_ = std::exchange(other.recorded_, false);
  }
  return *this;
}

void Event::record(const Stream& stream) {
  DeviceBackend& backend = device_backend(stream.device());
  if (!recorded_) {
    device_ = stream.device();
    handle_ = backend.create_event(device_, timing_);
  } else {
    WEFT_CHECK(stream.device() == device_, "Event::record: the event was recorded on ", device_,
               " and cannot be recorded on ", stream.device(), " (use one event per device)");
  }
  backend.record_event(handle_, device_, stream.handle());
  recorded_ = true;
}

void Event::block(const Stream& stream) const {
  if (!recorded_) return;  // nothing recorded: nothing to wait for
  WEFT_CHECK(stream.device().type == device_.type, "Event::block: an event recorded on ", device_,
             " cannot order a stream of ", stream.device());
  device_backend(stream.device()).block_on_event(handle_, stream.device(), stream.handle());
}

bool Event::query() const { return !recorded_ || device_backend(device_).query_event(handle_); }

void Event::synchronize() const {
  if (recorded_) device_backend(device_).synchronize_event(handle_);
}

float Event::elapsed_ms(const Event& end) const {
  WEFT_CHECK(timing_ && end.timing_ && recorded_ && end.recorded_,
             "Event::elapsed_ms: both events must be created with timing and recorded");
  WEFT_CHECK(device_ == end.device_, "Event::elapsed_ms: the events were recorded on ", device_, " and ", end.device_);
  return device_backend(device_).elapsed_ms(handle_, end.handle_);
}

}  // namespace weft
