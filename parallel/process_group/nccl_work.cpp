// NcclWork and NcclWatchdog, the NCCL backend's operations in flight; see nccl_work.h.
#include "parallel/process_group/nccl_work.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace weft::parallel::detail {

using Clock = NcclWork::Clock;

// --- NcclWork ------------------------------------------------------------------------

void NcclWork::queued(Event done) {
  {
    std::lock_guard lock(mutex_);
    done_ = std::move(done);
    queued_at_ = Clock::now();
  }
  cv_.notify_all();
}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  // Not queued yet: its communicator may still be connecting, which has its own bound.
  const Event& done = wait_until_queued(std::max(timeout.count() > 0 ? timeout : timeout_, kConnectBound));
  if (host_waits_) {
    done.synchronize();  // the watchdog's abort ends it if a peer never comes
    throw_if_failed();
  } else {
    done.block(current_stream(device_));
  }
}
bool NcclWork::is_completed() { return failed() || done(); }
std::exception_ptr NcclWork::exception() {
  std::lock_guard lock(mutex_);
  return error_.empty() ? nullptr : std::make_exception_ptr(Error(what_ + ": " + error_));
}

bool NcclWork::overdue(Clock::time_point now, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  if (done_) return now - queued_at_ > timeout;
  return now - created_at_ > std::max(timeout, kConnectBound);
}
bool NcclWork::done() {
  const Event* done = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (done_) done = &*done_;  // set once, never changed after
  }
  return done && done->query();
}
bool NcclWork::failed() {
  std::lock_guard lock(mutex_);
  return !error_.empty();
}
void NcclWork::fail(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (error_.empty()) error_ = why;
  }
  cv_.notify_all();
}

const Event& NcclWork::wait_until_queued(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const bool settled = cv_.wait_for(lock, timeout, [&] { return done_.has_value() || !error_.empty(); });
  lock.unlock();
  throw_if_failed();
  WEFT_CHECK(settled, what_, ": not queued after ", timeout.count(), " ms (its communicator is still connecting)");
  return *done_;
}
void NcclWork::throw_if_failed() {
  if (auto e = exception()) std::rethrow_exception(e);
}

// --- the watchdog --------------------------------------------------------------------

NcclWatchdog::NcclWatchdog(Group& group, std::chrono::milliseconds timeout) : group_(group), timeout_(timeout) {
  thread_ = std::thread([this] { watch(); });
}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  thread_.join();
}

void NcclWatchdog::watch() {
  std::unique_lock lock(watch_mutex_);
  while (!stopping_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) break;
    lock.unlock();
    try {
      inspect();
    } catch (const std::exception& e) {  // a CUDA error while querying events
      group_.fail_group(std::string("the watchdog's check failed: ") + e.what());
    }
    lock.lock();
  }
}

void NcclWatchdog::inspect() {
  std::vector<std::shared_ptr<NcclWork>> works, running;
  std::vector<DeviceCommunicator*> comms;
  if (!group_.in_flight(works, comms)) return;
  // The events are asked, and the finished works let go, without the group's mutex (Note
  // [Sends and receives on the caller's thread]): `works` keeps them until this returns.
  std::unordered_set<const NcclWork*> finished;
  for (const auto& work : works) {
    if (work->done()) finished.insert(work.get());
    else running.push_back(work);
  }
  if (!finished.empty()) group_.forget(finished);
  for (DeviceCommunicator* comm : comms) {
    const std::string error = comm->async_error();
    if (!error.empty()) return group_.fail_group("NCCL reported an error on " + comm->device().str() + ": " + error);
  }
  const auto now = Clock::now();
  for (const auto& work : running)
    if (work->overdue(now, timeout_) && !work->done())
      return group_.fail_group(work->what() + " was not done after " + std::to_string(timeout_.count()) +
                               " ms (the group's timeout): a rank is missing, stuck, or called other collectives");
}

}  // namespace weft::parallel::detail
