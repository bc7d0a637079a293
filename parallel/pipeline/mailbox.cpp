// Mailbox: activations and gradients between the stages of a pipeline in one process; see
// mailbox.h.
#include "parallel/pipeline/mailbox.h"

#include "core/error.h"

namespace weft::parallel::pipeline {

void Mailbox::send(const Action& send, const Tensor& tensor) {
  const int receiver = send.kind == ActionKind::SendForward ? send.stage + 1 : send.stage - 1;
  Letter letter{tensor.to(stage_device_(receiver)), Event()};
  letter.landed.record(current_stream(letter.tensor.device()));
  {
    std::lock_guard lock(mutex_);
    letters_.insert_or_assign(Key{send.kind, {send.stage, send.micro_batch}}, std::move(letter));
  }
  arrived_.notify_all();
}

Tensor Mailbox::recv(const Action& recv, Device) {
  const bool forward = recv.kind == ActionKind::RecvForward;
  const Key key{forward ? ActionKind::SendForward : ActionKind::SendBackward,
                {forward ? recv.stage - 1 : recv.stage + 1, recv.micro_batch}};
  std::unique_lock lock(mutex_);
  const bool arrived = arrived_.wait_for(lock, timeout_, [&] { return !failure_.empty() || letters_.count(key); });
  WEFT_CHECK(failure_.empty(), "pipeline: ", recv.str(), " stopped waiting: ", failure_);
  WEFT_CHECK(arrived, "pipeline: ", recv.str(), " waited ", timeout_.count(), " ms for stage ", key.second.first,
             "'s ", forward ? "activation" : "gradient", " of micro-batch ", recv.micro_batch,
             ", which never came (the pipeline's timeout)");
  auto node = letters_.extract(key);
  lock.unlock();
  Letter& letter = node.mapped();
  letter.landed.block(current_stream(letter.tensor.device()));
  return std::move(letter.tensor);
}

void Mailbox::fail(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = why;
  }
  arrived_.notify_all();
}

}  // namespace weft::parallel::pipeline
