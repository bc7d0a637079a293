// The NCCL backend's operations in flight: NcclWork, the Work of one operation, and
// NcclWatchdog, the thread that polls a group's works every 100 ms. Internal to
// process_group_nccl.cpp, not part of weft's API.
//
// A work ends with an event on its channel's stream. The watchdog asks those events, lets go
// of the finished works, and fails the group when one is overdue or NCCL reports an error
// (process_group_nccl.h, "Failures"). It reaches the group's state only through
// NcclWatchdog::Group, whose calls take the group's mutex for as long as the copy or the erase
// lasts: the event queries and frees themselves run outside it (Note [Sends and receives on the
// caller's thread] in process_group_nccl.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/stream.h"
#include "kernels/device_communicator.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel::detail {

// How long making a communicator may take, at least, whatever the group's timeout: connecting
// over sockets on a busy machine takes seconds.
inline constexpr std::chrono::milliseconds kConnectBound{60000};

// One operation: its end is an event on its channel's stream, recorded when the operation
// is queued there (at once for collectives and most sends and receives, by the channel's
// issuing thread for a channel's first ones: Note [Sends and receives on the caller's thread]).
class NcclWork final : public Work {
 public:
  using Clock = std::chrono::steady_clock;

  NcclWork(std::string what, Device device, bool host_waits, std::chrono::milliseconds timeout)
      : what_(std::move(what)), device_(device), host_waits_(host_waits), timeout_(timeout) {}

  void queued(Event done);

  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;
  std::exception_ptr exception() override;

  const std::string& what() const { return what_; }
  // Past its time: queued more than `timeout` ago (the operation itself), or, not queued
  // yet, made more than the connection's bound ago. The time a collective's first call spent
  // connecting its communicator does not count against the operation.
  bool overdue(Clock::time_point now, std::chrono::milliseconds timeout);
  bool done();
  bool failed();
  void fail(const std::string& why);

 private:
  const Event& wait_until_queued(std::chrono::milliseconds timeout);
  void throw_if_failed();

  std::string what_;
  Device device_;
  bool host_waits_;
  std::chrono::milliseconds timeout_;
  Clock::time_point created_at_ = Clock::now(), queued_at_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<Event> done_;
  std::string error_;  // set by the watchdog, or by a failed issue
};

// The watchdog thread of one ProcessGroupNccl: started by the constructor, stopped and joined
// by the destructor, which the group runs before it frees its channels.
class NcclWatchdog {
 public:
  // What the watchdog needs of its group; ProcessGroupNccl implements it.
  class Group {
   public:
    // Under the group's mutex: copies of the works in flight and of the group's communicators
    // into `works` and `comms`, or false (nothing copied) once the group has failed.
    virtual bool in_flight(std::vector<std::shared_ptr<NcclWork>>& works, std::vector<DeviceCommunicator*>& comms) = 0;
    // Under the group's mutex: drops the group's references to the works in `finished`.
    virtual void forget(const std::unordered_set<const NcclWork*>& finished) = 0;
    // Fails the group with `failure` (ProcessGroupNccl::fail_group: by default it ends the process).
    virtual void fail_group(const std::string& failure) = 0;

   protected:
    ~Group() = default;
  };

  // `timeout` is the group's: a work queued longer ago than that fails the group.
  NcclWatchdog(Group& group, std::chrono::milliseconds timeout);
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

 private:
  void watch();
  void inspect();

  Group& group_;
  std::chrono::milliseconds timeout_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace weft::parallel::detail
