// Mailbox: how the stages of a pipeline in one process hand each other activations and
// gradients (the in-process form of a schedule's SEND and RECV actions).
//
// A send copies the tensor to the receiving stage's device (on the sending thread) and posts
// it with an event recorded after the copy on that device's current stream; a receive takes
// it out, making
// its own current stream wait for the event (on CUDA the receiving stage never reads a
// tensor before the copy has landed, and the host does not block; on CPU devices events
// are no-ops). Sends never wait (as an isend); a receive waits for its send, at most
// `timeout`, and every wait ends at once, with an error naming the stage that failed, when
// any stage fails: no stage waits for ever on a stage that is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "core/stream.h"
#include "core/tensor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_runner.h"

namespace weft::parallel::pipeline {

class Mailbox final : public Transport {
 public:
  Mailbox(std::function<Device(int)> stage_device, std::chrono::milliseconds timeout)
      : stage_device_(std::move(stage_device)), timeout_(timeout) {}

  void send(const Action& send, const Tensor& tensor) override;
  // Takes what `recv`'s send posted (on `device` already).
  Tensor recv(const Action& recv, Device device) override;
  // Ends every wait, now and later, with an error that says `why`.
  void fail(const std::string& why);

 private:
  using Key = std::pair<ActionKind, std::pair<int, int>>;  // the send's kind, stage, micro-batch
  struct Letter {
    Tensor tensor;
    Event landed;
  };

  std::function<Device(int)> stage_device_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<Key, Letter> letters_;
  std::string failure_;
};

}  // namespace weft::parallel::pipeline
