// WorkQueue: operations run one at a time, in the order queued, on a thread of their own,
// each with a Work handle (parallel/process_group/process_group.h) that says when it is done.
//
// Process groups queue their collectives here: every rank queues them in program order, so
// every rank runs them in the same order, and the caller goes on (overlapping its own work)
// until it waits. The queue's destructor lets the running operation finish and fails the
// ones still queued.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// A Work completed by whoever runs the operation (finish()); wait() blocks until then.
class QueuedWork final : public Work {
 public:
  QueuedWork(std::string what, std::chrono::milliseconds default_timeout)
      : what_(std::move(what)), default_timeout_(default_timeout) {}
  void finish(std::exception_ptr error);
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;
  std::exception_ptr exception() override;

 private:
  std::string what_;
  std::chrono::milliseconds default_timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class WorkQueue {
 public:
  // `timeout`: how long wait() waits by default (plus a second's margin over the operation's own).
  explicit WorkQueue(std::chrono::milliseconds timeout);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `op`; an exception it throws becomes its Work's error, prefixed with `what`
  // unless it is a weft::Error already.
  std::shared_ptr<Work> enqueue(const std::string& what, std::function<void()> op);

 private:
  struct Task {
    std::string what;
    std::shared_ptr<QueuedWork> work;
    std::function<void()> op;
  };
  void run();

  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace weft::parallel
