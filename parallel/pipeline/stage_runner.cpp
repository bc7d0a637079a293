// run_stage_actions: one rank's actions of a schedule; see stage_runner.h.
#include "parallel/pipeline/stage_runner.h"

#include "core/error.h"
#include "core/trace.h"
#include "kernels/elementwise.h"

namespace weft::parallel::pipeline {

namespace {

// What one (stage, micro-batch) keeps between its actions.
struct Slot {
  Tensor input;        // the stage's input (a leaf that requires grad on stages > 0)
  Tensor output;       // until its backward
  Tensor grad_output;  // received from the next stage
  Tensor loss;         // last stage: the weighted loss, until its backward
};

}  // namespace

std::vector<int64_t> micro_batch_sizes(int64_t n, int m) {
  WEFT_CHECK(n >= m, "pipeline: a batch of ", n, " cannot be split into ", m, " micro-batches");
  std::vector<int64_t> sizes(m, n / m);
  for (int64_t i = 0; i < n % m; ++i) ++sizes[i];
  return sizes;
}

void run_stage_actions(const Schedule& schedule, int rank, const std::function<nn::Module&(int)>& stage,
                       const std::function<Device(int)>& device, Transport& transport, StageStep& step) {
  const int S = schedule.num_stages, m = schedule.num_micro_batches;
  std::vector<std::vector<Slot>> slots(S, std::vector<Slot>(m));
  step.losses.resize(m);
  step.outputs.resize(m);
  for (const Action& a : schedule.actions[rank]) {
    const Device here = device(a.stage);
    Slot& slot = slots[a.stage][a.micro_batch];
    TraceSpan span(a.str(), here);
    span.arg("stage", a.stage).arg("micro_batch", a.micro_batch);
    switch (a.kind) {
      case ActionKind::RecvForward:
        slot.input = transport.recv(a, here);
        slot.input.requires_grad_(is_floating(slot.input.dtype()));
        break;
      case ActionKind::Forward:
        if (a.stage == 0) slot.input = step.inputs.at(a.micro_batch);
        slot.output = stage(a.stage).forward(slot.input);
        if (a.stage == S - 1) {
          const double weight = static_cast<double>(step.sizes[a.micro_batch]) / static_cast<double>(step.batch);
          Tensor loss = (*step.criterion)(slot.output, step.targets.at(a.micro_batch));
          WEFT_CHECK(loss.numel() == 1, "pipeline: the criterion must return a scalar (the mean over the ",
                     "micro-batch); it returned shape ", loss.shape());
          slot.loss = mul(loss, weight);
          step.losses[a.micro_batch] = slot.loss.detach();
          step.outputs[a.micro_batch] = slot.output.detach();
        }
        break;
      case ActionKind::SendForward:
        transport.send(a, slot.output.detach());
        break;
      case ActionKind::RecvBackward:
        slot.grad_output = transport.recv(a, here);
        break;
      case ActionKind::Backward:
        if (a.stage == S - 1) slot.loss.backward();
        else if (slot.output.requires_grad()) slot.output.backward(slot.grad_output);
        slot.output = Tensor(), slot.grad_output = Tensor(), slot.loss = Tensor();  // the activations go
        break;
      case ActionKind::SendBackward: {
        Tensor grad = slot.input.grad();
        if (!grad.defined()) grad = zeros(slot.input.shape(), TensorOptions(slot.input.dtype(), here));
        transport.send(a, grad);
        slot.input = Tensor();
        break;
      }
    }
  }
}

}  // namespace weft::parallel::pipeline
