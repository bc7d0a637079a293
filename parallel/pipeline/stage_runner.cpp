// run_stage_actions: one rank's actions of a schedule; see stage_runner.h.
#include "parallel/pipeline/stage_runner.h"

#include <optional>

#include "core/autograd.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "nn/activation.h"

namespace weft::parallel::pipeline {

namespace {

// What one (stage, micro-batch) keeps between its actions.
struct Slot {
  Tensor input;        // the stage's input (a leaf that requires grad on stages > 0)
  Tensor output;       // until its backward (recomputed: until it is sent)
  Tensor grad_output;  // received from the next stage
  Tensor loss;         // last stage: the weighted loss, until its backward
  bool recompute = false;
  std::vector<uint64_t> generator_offsets;  // recomputed: where the stage's generators stood before the forward
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

// A recomputed micro-batch's second forward, with gradients: its generators start where the
// first forward's did, and go on afterwards from where they were; the buffers it writes
// (BatchNorm's statistics in training) are put back as the first forward left them. Both also
// when the forward throws (then quietly: a destructor must not throw while another error
// unwinds).
void forward_again(nn::Module& stage, const Action& a, bool last, Device device, StageStep& step, Slot& slot) {
  struct Restore {
    std::vector<Generator*> generators = {};
    std::vector<uint64_t> offsets = {};
    std::vector<Tensor> buffers = {}, kept = {};  // kept[i]: buffers[i] before the forward
    std::vector<uint32_t> versions = {};
    bool done = false;
    void operator()() {
      done = true;
      for (size_t i = 0; i < offsets.size(); ++i) generators[i]->set_offset(offsets[i]);
      NoGradGuard no_grad;
      // Only the buffers written: one that the backward reads as saved (BatchNorm's statistics
      // in evaluation) must keep its version.
      for (size_t i = 0; i < kept.size(); ++i)
        if (buffers[i].version() != versions[i]) buffers[i].copy_(kept[i]);
    }
    ~Restore() {
      if (done) return;
      try {
        (*this)();
      } catch (...) {  // the error being unwound is the one to report
      }
    }
  } restore{.generators = nn::forward_generators(stage, device), .buffers = stage.buffers()};
  for (size_t i = 0; i < restore.generators.size(); ++i) {
    restore.offsets.push_back(restore.generators[i]->offset());
    restore.generators[i]->set_offset(slot.generator_offsets.at(i));
  }
  for (const Tensor& b : restore.buffers) {
    restore.versions.push_back(b.version());
    restore.kept.push_back(b.clone());
  }
  TraceSpan span("recompute", device);
  span.arg("stage", a.stage).arg("micro_batch", a.micro_batch);
  forward(stage, a, last, step, slot);
  restore();
}

// Whether rank's Forward at `index` is followed, as the rank's next computation, by the same
// micro-batch's Backward (the last stage under 1F1B): recomputing it would save nothing.
bool backward_comes_next(const std::vector<Action>& actions, size_t index) {
  const Action& f = actions[index];
  for (size_t i = index + 1; i < actions.size(); ++i) {
    const Action& next = actions[i];
    if (next.kind != ActionKind::Forward && next.kind != ActionKind::Backward) continue;
    return next.kind == ActionKind::Backward && next.stage == f.stage && next.micro_batch == f.micro_batch;
  }
  return false;
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
  const std::vector<Action>& actions = schedule.actions[rank];
  std::vector<size_t> last_backward(S, actions.size());  // per stage: the index of its last Backward
  for (size_t index = 0; index < actions.size(); ++index)
    if (actions[index].kind == ActionKind::Backward) last_backward[actions[index].stage] = index;
  for (size_t index = 0; index < actions.size(); ++index) {
    const Action& a = actions[index];
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
        const bool last = a.stage == S - 1;
        slot.recompute = a.micro_batch < step.recompute_below && !backward_comes_next(actions, index);
        std::optional<NoGradGuard> no_grad;
        if (slot.recompute) {
          slot.generator_offsets.clear();
          for (Generator* g : nn::forward_generators(stage(a.stage), here))
            slot.generator_offsets.push_back(g->offset());
          no_grad.emplace();
        }
        forward(stage(a.stage), a, last, step, slot);
        if (last) {
          step.losses[a.micro_batch] = slot.loss.detach();
          step.outputs[a.micro_batch] = slot.output.detach();
          if (slot.recompute) slot.output = Tensor(), slot.loss = Tensor();  // made again in the backward
        }
        break;
      }
      case ActionKind::SendForward:
        transport.send(a, slot.output.detach());
        if (slot.recompute) slot.output = Tensor();  // made again in the backward
        break;
      case ActionKind::RecvBackward:
        slot.grad_output = transport.recv(a, here);
        break;
      case ActionKind::Backward:
        if (slot.recompute) forward_again(stage(a.stage), a, a.stage == S - 1, here, step, slot);
        if (index == last_backward[a.stage] && step.before_last_backward)
          step.before_last_backward(a.stage, a.stage == S - 1 ? slot.loss : slot.output);
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
