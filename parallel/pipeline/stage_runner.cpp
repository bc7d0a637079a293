// run_stage_actions: one rank's actions of a schedule; see stage_runner.h.
#include "parallel/pipeline/stage_runner.h"

#include <optional>

#include "core/autograd.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/trace.h"
#include "kernels/elementwise.h"

namespace weft::parallel::pipeline {

namespace {

// What one (stage, micro-batch) keeps between its actions.
struct Slot {
  Tensor input;        // the stage's input (a leaf that requires grad on stages > 0)
  Tensor output;       // until its backward (recomputed: until it is sent)
  Tensor grad_output;  // received from the next stage
  Tensor loss;         // last stage: the weighted loss, until its backward
  uint64_t generator_offset = 0;  // recomputed: where the stage device's generator stood before the forward
};

// The stage's forward on the slot's input, and on the last stage the micro-batch's weighted loss.
void forward(nn::Module& stage, const Action& a, bool last, StageStep& step, Slot& slot) {
  slot.output = stage.forward(slot.input);
  if (!last) return;
  const double weight = static_cast<double>(step.sizes[a.micro_batch]) / static_cast<double>(step.batch);
  Tensor loss = (*step.criterion)(slot.output, step.targets.at(a.micro_batch));
  WEFT_CHECK(loss.numel() == 1, "pipeline: the criterion must return a scalar (the mean over the ",
             "micro-batch); it returned shape ", loss.shape());
  slot.loss = mul(loss, weight);
}

// A recomputed micro-batch's second forward, with gradients, drawing what the first drew; the
// stage's buffers are left as the first forward left them.
void forward_again(nn::Module& stage, const Action& a, bool last, Device device, StageStep& step, Slot& slot) {
  std::vector<Tensor> buffers = stage.buffers(), kept;
  for (const Tensor& b : buffers) kept.push_back(b.clone());
  Generator& generator = default_generator(device);
  const uint64_t now = generator.offset();
  generator.set_offset(slot.generator_offset);
  forward(stage, a, last, step, slot);
  generator.set_offset(now);
  NoGradGuard no_grad;
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(kept[i]);
}

}  // namespace

int recomputed_micro_batches(const std::string& mode, int m) {
  if (mode == "never") return 0;
  if (mode == "except_last") return m - 1;
  if (mode == "always") return m;
  WEFT_FAIL("pipeline: activation_checkpointing must be never, except_last or always, got '", mode, "'");
}

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
      case ActionKind::Forward: {
        if (a.stage == 0) slot.input = step.inputs.at(a.micro_batch);
        const bool recompute = a.micro_batch < step.recompute_below, last = a.stage == S - 1;
        std::optional<NoGradGuard> no_grad;
        if (recompute) {
          slot.generator_offset = default_generator(here).offset();
          no_grad.emplace();
        }
        forward(stage(a.stage), a, last, step, slot);
        if (last) {
          step.losses[a.micro_batch] = slot.loss.detach();
          step.outputs[a.micro_batch] = slot.output.detach();
          if (recompute) slot.output = Tensor(), slot.loss = Tensor();  // made again in the backward
        }
        break;
      }
      case ActionKind::SendForward:
        transport.send(a, slot.output.detach());
        if (a.micro_batch < step.recompute_below) slot.output = Tensor();  // made again in the backward
        break;
      case ActionKind::RecvBackward:
        slot.grad_output = transport.recv(a, here);
        break;
      case ActionKind::Backward:
        if (a.micro_batch < step.recompute_below) forward_again(stage(a.stage), a, a.stage == S - 1, here, step, slot);
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
