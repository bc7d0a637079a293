// run_stage_actions: what one rank of a pipeline does in a training step, whatever carries
// its messages: its list of a schedule's actions, run in order on its stages.
//
// Pipeline (one process, a thread per device) and DistributedPipeline (a process per rank)
// both run each rank's list through this; they differ in the Transport that carries the
// SEND and RECV actions (a Mailbox between threads, or a process group's send and recv).
//
// Each (stage, micro-batch) keeps its input, output and loss from its forward until its
// backward. A stage's input from the previous stage is a leaf of its own that requires
// grad; its backward runs from the gradient the next stage sent (the last stage's from its
// weighted loss), and the input's gradient is what it sends back. So stages never share an
// autograd graph, and the activations of a micro-batch go as soon as its backward has run.
//
// Activation checkpointing (GPipe's re-materialisation, torchgpipe's `checkpoint`): the
// micro-batches below StageStep::recompute_below run their forward without gradients and
// keep only their input; their backward runs the forward again with gradients (a "recompute"
// span in the trace), then goes on as any other. A stage then holds the activations of the
// micro-batch whose backward runs, not of every micro-batch in flight, for one more forward
// per micro-batch. A micro-batch whose backward is its rank's very next computation after its
// forward (the last stage's, under 1F1B) is not recomputed: nothing would be saved. The second
// forward draws the same random numbers as the first (the stage device's default generator
// and any generator a Dropout layer holds of its own are set back to where the first forward
// started them, then to where they were), and the buffers it writes are put back as the first
// forward left them (BatchNorm counts each micro-batch once): the results are those of the
// plain pipeline, bit for bit. The rewind assumes that nothing else draws from those
// generators during the step (Pipeline runs one thread per device).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/criterion.h"
#include "nn/module.h"
#include "parallel/pipeline/schedule.h"

namespace weft::parallel::pipeline {

using nn::Criterion;  // the mean over the micro-batch

// Carries a rank's activations and gradients to the rank of another stage.
class Transport {
 public:
  virtual ~Transport() = default;
  // `send` is a SEND_F or SEND_B action; `tensor` lives on the sending stage's device.
  virtual void send(const Action& send, const Tensor& tensor) = 0;
  // `recv` is a RECV_F or RECV_B action; the tensor comes back on `device` (the receiving
  // stage's), ready for the receiving thread's current stream.
  virtual Tensor recv(const Action& recv, Device device) = 0;
};

// The sizes of the m micro-batches of a batch of n, as torch.tensor_split makes them (the
// first n % m one longer); an error when n < m.
std::vector<int64_t> micro_batch_sizes(int64_t n, int m);

// The micro-batches of m that a pipeline's activation_checkpointing option recomputes (those
// below the answer), as torchgpipe's checkpoint modes: "never" none, "except_last" all but
// the last (torchgpipe's default: there the last micro-batch's backward comes first; weft's
// GPipe runs the backwards in forward order, so sparing it keeps its activations to the end),
// "always" all. Another mode is an error naming it.
int recomputed_micro_batches(const std::string& mode, int m);

// One step's data for the stages of one rank.
struct StageStep {
  std::vector<Tensor> inputs;    // stage 0's micro-batches (on its device), where this rank has stage 0
  std::vector<Tensor> targets;   // the last stage's, where this rank has it
  std::vector<int64_t> sizes;    // every micro-batch's size
  int64_t batch = 0;             // their sum
  int recompute_below = 0;       // micro-batches [0, this) are recomputed (activation checkpointing)
  const Criterion* criterion = nullptr;
  // Called with a stage's index and what its last Backward action in this rank's list runs the
  // backward from (the output, or the last stage's loss), just before that backward: the
  // gradients it accumulates are the step's last (a replicated pipeline's reducers start averaging
  // them then: distributed_pipeline.h).
  std::function<void(int stage, const Tensor& from)> before_last_backward;
  // Filled for the last stage's micro-batches: the weighted losses and the outputs, detached.
  std::vector<Tensor> losses, outputs;
};

// Runs rank `rank`'s actions of `schedule`: `stage(s)` is stage s's module (on `device(s)`).
void run_stage_actions(const Schedule& schedule, int rank, const std::function<nn::Module&(int)>& stage,
                       const std::function<Device(int)>& device, Transport& transport, StageStep& step);

}  // namespace weft::parallel::pipeline
