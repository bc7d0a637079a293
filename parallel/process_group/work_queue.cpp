// WorkQueue: one worker thread, a FIFO of operations, a Work per operation.
#include "parallel/process_group/work_queue.h"

#include "core/error.h"

namespace weft::parallel {

void QueuedWork::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

void QueuedWork::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = default_timeout_;
  std::unique_lock lock(mutex_);
  // A margin over the operation's own timeout, which the backend enforces and reports itself.
  const bool done = cv_.wait_for(lock, timeout + std::chrono::seconds(1), [&] { return done_; });
  WEFT_CHECK(done, what_, ": not done after ", timeout.count(), " ms (it is still queued or running, and will "
             "write into its tensors when it finishes)");
  if (error_) std::rethrow_exception(error_);
}

bool QueuedWork::is_completed() {
  std::lock_guard lock(mutex_);
  return done_;
}

std::exception_ptr QueuedWork::exception() {
  std::lock_guard lock(mutex_);
  return error_;
}

WorkQueue::WorkQueue(std::chrono::milliseconds timeout) : timeout_(timeout), worker_([this] { run(); }) {}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<Work> WorkQueue::enqueue(const std::string& what, std::function<void()> op) {
  auto work = std::make_shared<QueuedWork>(what, timeout_);
  {
    std::lock_guard lock(mutex_);
    WEFT_CHECK(!stopping_, what, ": the process group is being destroyed");
    queue_.push_back({what, work, std::move(op)});
  }
  cv_.notify_one();
  return work;
}

void WorkQueue::run() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        for (Task& t : queue_)
          t.work->finish(std::make_exception_ptr(Error(t.what + ": the process group was destroyed before it ran")));
        queue_.clear();
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task.op();
      task.work->finish(nullptr);
    } catch (const Error&) {
      task.work->finish(std::current_exception());
    } catch (const std::exception& e) {  // a backend's own errors: a peer gone, a timeout
      task.work->finish(std::make_exception_ptr(Error(task.what + ": " + e.what())));
    } catch (...) {
      task.work->finish(std::make_exception_ptr(Error(task.what + ": failed with an exception of unknown type")));
    }
  }
}

}  // namespace weft::parallel
