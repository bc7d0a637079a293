// PipelineStrategy: the TrainLoop's 'pipeline' mode (weft-train --mode pipeline).
//
// The model, as an nn::Sequential (a Sequential itself, or ConvNet or ResNet through their
// as_sequential(): the same layers, the same state_dict names), is split into stages over
// the devices (parallel/pipeline/pipeline.h); each step splits the batch into micro-batches
// and runs the schedule (gpipe, 1f1b or interleaved), the gradients accumulate in every
// stage's parameters on its device, and one optimizer steps them all. Batches are delivered
// to the first device, and the loss and outputs come back there. Evaluation runs the stages
// one after the other on the whole batch. One process, so the epoch's totals need no
// reduction; checkpoints hold the model's own names and load into single-device runs and
// back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/pipeline/pipeline.h"
#include "train/strategy.h"

namespace weft::train {

// The model as the Sequential a pipeline splits: a Sequential itself, or a ConvNet's or
// ResNet's as_sequential() (the same layers); another model is an error naming it.
std::shared_ptr<nn::Sequential> pipeline_sequential(const std::shared_ptr<nn::Module>& model);

struct PipelineStrategyOptions {
  std::vector<Device> devices;  // one stage per device (virtual_stages per device when interleaved)
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::vector<size_t> balance;                   // layers per stage; empty: as even as possible
  parallel::pipeline::Balancer balance_by;       // instead of balance: measured on the first device
  std::string activation_checkpointing = "never";  // or except_last, always (pipeline.h)
};

class PipelineStrategy final : public Strategy {
 public:
  explicit PipelineStrategy(PipelineStrategyOptions options);

  ParallelMode mode() const override { return ParallelMode::Pipeline; }
  int world_size() const override { return static_cast<int>(options_.devices.size()); }
  Device input_device() const override { return options_.devices[0]; }
  Tensor train_step(const data::Batch& batch, const Criterion& criterion, optim::Optimizer& optimizer) override;
  std::vector<size_t> stage_layers() const override;

  const PipelineStrategyOptions& options() const { return options_; }
  parallel::pipeline::Pipeline& pipeline() const;  // what prepare() made

 private:
  std::shared_ptr<nn::Module> prepare_model(std::shared_ptr<nn::Module> model) override;

  PipelineStrategyOptions options_;
  std::shared_ptr<parallel::pipeline::Pipeline> pipeline_;
};

}  // namespace weft::train
