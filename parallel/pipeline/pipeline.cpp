// Pipeline: stages of a Sequential on devices, run by a schedule; see pipeline.h.
#include "parallel/pipeline/pipeline.h"

#include <atomic>
#include <exception>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "kernels/shape_ops.h"
#include "parallel/local/fork_join.h"
#include "parallel/pipeline/mailbox.h"

namespace weft::parallel::pipeline {

namespace {

void check_devices(const std::vector<Device>& devices) {
  WEFT_CHECK(!devices.empty(), "Pipeline: no devices (give one per rank: {cpu:0, cpu:1} or {cuda:0, cuda:1})");
  for (size_t i = 0; i < devices.size(); ++i) {
    WEFT_CHECK(devices[i].type == devices[0].type, "Pipeline: devices of one type, got ", devices[0], " and ",
               devices[i]);
    for (size_t j = 0; j < i; ++j)
      WEFT_CHECK(devices[j] != devices[i], "Pipeline: device ", devices[i], " is given twice");
  }
}

// A tensor tied between two stages (nn/module.h, Note [Tied parameters]) would live on one
// stage's device and take one stage's gradient: the stages would no longer compute the model.
void check_no_tensor_across_stages(const std::vector<std::shared_ptr<nn::Sequential>>& stages) {
  std::unordered_map<const TensorImpl*, std::pair<size_t, std::string>> owner;
  for (size_t k = 0; k < stages.size(); ++k) {
    nn::NamedTensors tensors = stages[k]->named_parameters();
    for (auto& entry : stages[k]->named_buffers()) tensors.push_back(entry);
    for (const auto& [name, t] : tensors) {
      auto [it, is_new] = owner.try_emplace(t.impl(), k, name);
      WEFT_CHECK(is_new || it->second.first == k, "Pipeline: '", name, "' of stage ", k, " is the same tensor as '",
                 it->second.second, "' of stage ", it->second.first, " (tied weights); a pipeline's stages own their "
                 "tensors: build the model untied (a GPT: GPTConfig::tie_embeddings = false)");
    }
  }
}

}  // namespace

std::vector<std::shared_ptr<nn::Sequential>> split_stages(const nn::Sequential& model, int stages,
                                                          const std::vector<size_t>& balance) {
  const size_t layers = model.size();
  WEFT_CHECK(stages >= 1, "Pipeline: at least one stage, got ", stages);
  std::vector<size_t> counts = balance;
  if (counts.empty()) {
    WEFT_CHECK(layers >= static_cast<size_t>(stages), "Pipeline: ", stages,
               " stages need at least as many layers; the Sequential has ", layers);
    counts.assign(stages, layers / stages);
    for (size_t k = 0; k < layers % stages; ++k) ++counts[k];
  }
  WEFT_CHECK(counts.size() == static_cast<size_t>(stages), "Pipeline: balance has ", counts.size(),
             " entries for ", stages, " stages");
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  WEFT_CHECK(total == layers, "Pipeline: balance puts ", total, " layers in stages; the Sequential has ", layers);
  std::vector<std::shared_ptr<nn::Sequential>> out;
  size_t next = 0;
  for (int k = 0; k < stages; ++k) {
    WEFT_CHECK(counts[k] >= 1, "Pipeline: stage ", k, " has no layers (balance ", counts[k], ")");
    auto stage = std::make_shared<nn::Sequential>();
    for (size_t i = 0; i < counts[k]; ++i, ++next) {
      const auto& [name, layer] = model.named_children()[next];
      stage->push_back(name, layer);  // the Sequential's own names
    }
    out.push_back(std::move(stage));
  }
  check_no_tensor_across_stages(out);
  return out;
}

std::vector<size_t> layer_counts(const std::vector<std::shared_ptr<nn::Sequential>>& stages) {
  std::vector<size_t> counts;
  for (const auto& stage : stages) counts.push_back(stage->size());
  return counts;
}

Pipeline::Pipeline(std::shared_ptr<nn::Sequential> model, PipelineOptions options)
    : Module("Pipeline"), model_(std::move(model)), options_(std::move(options)) {
  WEFT_CHECK(model_ != nullptr, "Pipeline: the model is null");
  check_devices(options_.devices);
  WEFT_CHECK(options_.virtual_stages >= 1, "Pipeline: virtual_stages must be at least 1, got ",
             options_.virtual_stages);
  const int ranks = static_cast<int>(options_.devices.size()), stages = ranks * options_.virtual_stages;
  WEFT_CHECK(options_.balance.empty() || !options_.balance_by, "Pipeline: give balance or balance_by, not both");
  recomputed_micro_batches(options_.activation_checkpointing, 1);  // a mode it knows
  const std::vector<size_t> balance =
      options_.balance_by ? options_.balance_by(*model_, stages, options_.devices[0]) : options_.balance;
  stages_ = split_stages(*model_, stages, balance);
  options_.balance_by = nullptr;  // and with it what it holds (by_time's sample)
  for (int s = 0; s < num_stages(); ++s) stages_[s]->to(stage_device(s));
  // The Sequential's children are this module's, under the same names.
  for (const auto& [name, child] : model_->named_children()) register_module(name, child);
  set_schedule(make_schedule(options_.schedule, ranks, options_.micro_batches, options_.virtual_stages));
}

void Pipeline::set_schedule(Schedule schedule) {
  validate(schedule);
  WEFT_CHECK(schedule.num_stages == num_stages() && schedule.num_ranks() == static_cast<int>(options_.devices.size()),
             "Pipeline: schedule '", schedule.name, "' has ", schedule.num_stages, " stages on ", schedule.num_ranks(),
             " ranks; this pipeline has ", num_stages(), " stages on ", options_.devices.size(), " devices");
  schedule_ = std::move(schedule);
}

const Schedule& Pipeline::short_schedule(int micro_batches) {
  auto it = short_schedules_.find(micro_batches);
  if (it == short_schedules_.end())
    it = short_schedules_
             .emplace(micro_batches, make_schedule(options_.schedule, static_cast<int>(options_.devices.size()),
                                                   micro_batches, options_.virtual_stages))
             .first;
  return it->second;
}

std::shared_ptr<nn::Module> Pipeline::shallow_copy() const {
  WEFT_FAIL("Pipeline: cannot be cloned or replicated (clone its Sequential and build a new Pipeline)");
}

std::string Pipeline::extra_repr() const {
  std::ostringstream out;
  out << "stages=" << num_stages() << ", devices=[";
  for (size_t i = 0; i < options_.devices.size(); ++i) out << (i ? ", " : "") << options_.devices[i];
  out << "], balance=[";
  for (int s = 0; s < num_stages(); ++s) out << (s ? ", " : "") << stages_[s]->size();
  out << "], schedule=" << schedule_.name << ", micro_batches=" << schedule_.num_micro_batches;
  return out.str();
}

Tensor Pipeline::forward(const Tensor& input) {
  Tensor x = input;
  for (int s = 0; s < num_stages(); ++s) {
    TraceSpan span("forward", stage_device(s));
    span.arg("stage", s);
    x = stages_[s]->forward(x.to(stage_device(s)));
  }
  return x.to(output_device());
}

StepResult Pipeline::step(const Tensor& input, const Tensor& target, const Criterion& criterion) {
  WEFT_CHECK(GradMode::is_enabled(), "Pipeline::step trains (forward and backward); under NoGradGuard use forward()");
  WEFT_CHECK(input.dim() >= 1 && target.dim() >= 1 && input.size(0) == target.size(0), "Pipeline::step: input ",
             input.shape(), " and target ", target.shape(), " must have the same batch size (dim 0)");
  // A batch smaller than the micro-batches (an epoch's short last batch) runs as one
  // micro-batch per sample (interleaved: a multiple of the devices), with the built-in
  // schedule of that size.
  const int fits = schedule_.name != options_.schedule
                       ? schedule_.num_micro_batches
                       : micro_batches_for_batch(options_.schedule, static_cast<int>(options_.devices.size()),
                                                 schedule_.num_micro_batches, input.size(0));
  const Schedule& schedule = fits == schedule_.num_micro_batches ? schedule_ : short_schedule(fits);
  const int m = schedule.num_micro_batches, S = num_stages(), R = schedule.num_ranks();
  StageStep data;
  data.batch = input.size(0);
  data.sizes = micro_batch_sizes(data.batch, m);
  data.inputs = split(input.detach().to(stage_device(0)), data.sizes);
  data.targets = split(target.detach().to(stage_device(S - 1)), data.sizes);
  data.criterion = &criterion;
  data.recompute_below = recomputed_micro_batches(options_.activation_checkpointing, m);
  // Each rank's thread runs its actions on its own copy of the step's data; the last
  // stage's rank fills in the losses and outputs.
  std::vector<StageStep> per_rank(R, data);
  Mailbox mailbox([this](int s) { return stage_device(s); }, options_.timeout);

  // A failing rank ends the others' waits; the first to fail is the one reported (the
  // others' errors only say that they stopped waiting).
  std::atomic<int> first_failed{-1};
  std::vector<std::function<void()>> tasks;
  for (int r = 0; r < R; ++r)
    tasks.push_back([&, r] {
      auto stop_the_others = [&](const std::string& why) {
        int none = -1;
        first_failed.compare_exchange_strong(none, r);
        mailbox.fail("rank " + std::to_string(r) + " (" + options_.devices[r].str() + ") failed: " + why);
      };
      try {
        run_stage_actions(
            schedule, r, [this](int s) -> nn::Module& { return *stages_[s]; },
            [this](int s) { return stage_device(s); }, mailbox, per_rank[r]);
      } catch (const std::exception& e) {
        stop_the_others(e.what());
        throw;
      } catch (...) {
        stop_the_others("an exception that is not a std::exception");
        throw;
      }
    });
  const std::vector<std::exception_ptr> errors = fork_join(tasks);
  int failed = first_failed.load();
  for (int r = 0; r < R && failed < 0; ++r)
    if (errors[r]) failed = r;
  if (failed >= 0) {
    try {
      std::rethrow_exception(errors[failed]);
    } catch (const std::exception& e) {
      WEFT_FAIL("Pipeline::step (schedule ", schedule.name, ") on rank ", failed, " (", options_.devices[failed],
                "): ", e.what());
    } catch (...) {
      WEFT_FAIL("Pipeline::step (schedule ", schedule.name, ") on rank ", failed, " (", options_.devices[failed],
                "): an exception that is not a std::exception");
    }
  }

  const StageStep& last = per_rank[schedule.rank_of(S - 1)];
  NoGradGuard no_grad;
  Tensor loss = last.losses[0];
  for (int i = 1; i < m; ++i) loss = add(loss, last.losses[i]);
  return {loss.to(output_device()), cat(last.outputs).to(output_device())};
}

}  // namespace weft::parallel::pipeline
