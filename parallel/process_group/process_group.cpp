// The names of the reduce ops (for messages and the debug check), then() and completed_work().
#include "parallel/process_group/process_group.h"

#include <mutex>

#include "core/error.h"

namespace weft::parallel {

namespace {

class ThenWork final : public Work {
 public:
  ThenWork(std::shared_ptr<Work> work, std::function<void()> continuation)
      : work_(std::move(work)), continuation_(std::move(continuation)) {}

  void wait(std::chrono::milliseconds timeout) override {
    work_->wait(timeout);  // rethrows the operation's error
    run_continuation();
    if (auto error = exception()) std::rethrow_exception(error);
  }
  bool is_completed() override {
    if (!work_->is_completed()) return false;
    if (!work_->exception()) run_continuation();
    return true;
  }
  std::exception_ptr exception() override {
    if (auto error = work_->exception()) return error;
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  void run_continuation() {
    std::lock_guard lock(mutex_);
    if (ran_) return;
    ran_ = true;
    try {
      continuation_();
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  std::shared_ptr<Work> work_;
  std::function<void()> continuation_;
  std::mutex mutex_;
  bool ran_ = false;
  std::exception_ptr error_;
};

class CompletedWork final : public Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
  std::exception_ptr exception() override { return nullptr; }
};

}  // namespace

std::shared_ptr<Work> then(std::shared_ptr<Work> work, std::function<void()> continuation) {
  WEFT_CHECK(work != nullptr && continuation != nullptr, "then: needs an operation and a continuation");
  return std::make_shared<ThenWork>(std::move(work), std::move(continuation));
}

std::shared_ptr<Work> completed_work() { return std::make_shared<CompletedWork>(); }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "unknown";
}

}  // namespace weft::parallel
