// Pipeline: an nn::Sequential split into stages on several devices, trained on
// micro-batches by a schedule (torch.distributed.pipelining's PipelineStage + schedules,
// in one process; torchgpipe's balance).
//
//   auto model = nn::ConvNet().as_sequential();              // or any nn::Sequential
//   parallel::pipeline::Pipeline pipe(model, {.devices = {Device("cpu:0"), Device("cpu:1")},
//                                             .micro_batches = 4, .schedule = "1f1b"});
//   optim::SGD sgd(pipe.parameters(), {0.01});               // parameters on both devices
//   auto result = pipe.step(images, labels, cross_entropy_loss);   // forward + backward
//   sgd.step();
//
// Stages: the Sequential's layers in order, `balance[k]` of them on stage k (torchgpipe's
// balance), or as `balance_by` measures them (balance.h: by_time(sample) evens out the
// layers' forward and backward times), or spread as evenly as the layer count allows when
// neither is given. Stage s lives on devices[s % devices.size()]: one stage per device, or
// `virtual_stages` per device for the interleaved schedule. `activation_checkpointing`
// trades a second forward for the activations held between forward and backward
// (stage_runner.h). The layers are the Sequential's own (moved to their
// stage's device), so the Pipeline's state_dict() has the Sequential's names: checkpoints
// go from a pipeline to one device and back.
//
// step(input, target, criterion): the batch is split along dim 0 into micro_batches parts
// (torch.tensor_split: sizes differ by at most one; a batch smaller than that, such as an
// epoch's short last batch, runs one sample per micro-batch under the same built-in schedule
// for that many; interleaved: micro_batches_for_batch in schedule.h), the schedule runs with one host thread
// per device (fork_join: on CUDA each stage's kernels go to its device's stream, ordered
// with the next stage's by events; CPU logical devices compute at once), and the gradients
// accumulate in the parameters. Each stage's forward input is its own leaf, its backward
// runs from the gradient its next stage sent, so stages never share an autograd graph (the
// input batch gets no gradient). The criterion must return the plain mean over its
// micro-batch's samples; each micro-batch's loss is weighted by its share of the batch, so
// the gradients are those of the whole batch's mean loss, and the reported loss is that
// mean, whatever the schedule and the number of micro-batches. (A loss normalised otherwise,
// such as cross-entropy with class weights or ignored targets, normalises per micro-batch,
// not per batch, as in torch.distributed.pipelining.)
// BatchNorm in training mode normalises each micro-batch with its own statistics (as in
// every pipeline library), so only models without it (or with one micro-batch) train
// exactly as on one device.
//
// forward(input): plain model parallelism, as seeds 002/003 write it: the whole batch
// through stage after stage, moved between devices by differentiable copies (loss.backward()
// works through it), one device busy at a time. For evaluation and for comparison.
//
// Tensors shared by two stages (tied weights) are not supported. The same schedules across
// processes, a stage per rank: DistributedPipeline (distributed_pipeline.h).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "parallel/pipeline/balance.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_runner.h"

namespace weft::parallel::pipeline {

struct PipelineOptions {
  std::vector<Device> devices;      // one per rank; distinct, of one type
  std::vector<size_t> balance;      // layers per stage; empty: as even as possible
  Balancer balance_by;              // instead of balance: measured on the first device
  int micro_batches = 1;
  std::string schedule = "gpipe";   // gpipe, 1f1b or interleaved
  int virtual_stages = 1;           // stages per device (interleaved)
  // never, except_last or always: which micro-batches keep only their inputs until their
  // backward and run their forward again there (stage_runner.h; torchgpipe's checkpoint).
  std::string activation_checkpointing = "never";
  // Where step()'s loss and output and forward()'s output land; the last stage's device
  // when not given.
  std::optional<Device> output_device;
  // A stage that waits longer than this for another's activation or gradient fails.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

struct StepResult {
  Tensor loss;    // the batch's mean loss (a detached scalar on the output device)
  Tensor output;  // the last stage's outputs for the whole batch (detached, output device)
};

// The layers of `model` as `stages` consecutive Sequentials, under the model's names:
// balance[k] layers in stage k (summing to model.size()), or as even as possible (the first
// ones one longer) when empty.
std::vector<std::shared_ptr<nn::Sequential>> split_stages(const nn::Sequential& model, int stages,
                                                          const std::vector<size_t>& balance = {});

// The layers per stage of a split.
std::vector<size_t> layer_counts(const std::vector<std::shared_ptr<nn::Sequential>>& stages);

class Pipeline : public nn::Module {
 public:
  Pipeline(std::shared_ptr<nn::Sequential> model, PipelineOptions options);

  StepResult step(const Tensor& input, const Tensor& target, const Criterion& criterion);
  Tensor forward(const Tensor& input) override;

  // A schedule of one's own (validated here; its stages and ranks must match).
  void set_schedule(Schedule schedule);
  const Schedule& schedule() const { return schedule_; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  nn::Sequential& stage(int s) const { return *stages_.at(s); }
  std::vector<size_t> balance() const { return layer_counts(stages_); }  // layers per stage
  Device stage_device(int s) const { return options_.devices[s % options_.devices.size()]; }
  Device output_device() const { return options_.output_device.value_or(stage_device(num_stages() - 1)); }
  const std::shared_ptr<nn::Sequential>& sequential() const { return model_; }
  std::string extra_repr() const override;

 protected:
  std::shared_ptr<nn::Module> shallow_copy() const override;

 private:
  std::shared_ptr<nn::Sequential> model_;
  PipelineOptions options_;
  // The built-in schedule for a batch smaller than the micro-batches, by its size.
  const Schedule& short_schedule(int micro_batches);

  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  Schedule schedule_;
  std::map<int, Schedule> short_schedules_;
};

}  // namespace weft::parallel::pipeline
