// Strategy's shared step and the single-device strategy.
#include "train/strategy.h"

#include "core/error.h"
#include "core/trace.h"
#include "data/sampler.h"

namespace weft::train {

ParallelMode parse_parallel_mode(const std::string& name) {
  if (name == "single") return ParallelMode::Single;
  if (name == "dp") return ParallelMode::DataParallel;
  if (name == "ddp") return ParallelMode::DistributedDataParallel;
  if (name == "pipeline") return ParallelMode::Pipeline;
  WEFT_FAIL("unknown parallel mode '", name, "' (expected single, dp, ddp or pipeline)");
}

const char* parallel_mode_name(ParallelMode mode) {
  switch (mode) {
    case ParallelMode::Single: return "single";
    case ParallelMode::DataParallel: return "dp";
    case ParallelMode::DistributedDataParallel: return "ddp";
    case ParallelMode::Pipeline: return "pipeline";
  }
  return "unknown";
}

std::shared_ptr<nn::Module> Strategy::prepare(std::shared_ptr<nn::Module> model) {
  WEFT_CHECK(runner_ == nullptr, "Strategy::prepare: this strategy has prepared a model already (a strategy runs one "
             "model, for one TrainLoop: make another)");
  runner_ = prepare_model(std::move(model));
  return runner_;
}

nn::Module& Strategy::runner() const {
  WEFT_CHECK(runner_ != nullptr, "Strategy: runner() before prepare()");
  return *runner_;
}

Tensor Strategy::train_step(const data::Batch& batch, const Criterion& criterion, optim::Optimizer& optimizer) {
  nn::Module& model = runner();
  const Device device = input_device();
  optimizer.zero_grad();
  Tensor loss;
  {
    TraceSpan span("forward", device);
    loss = criterion(model.forward(batch.data), batch.target);
  }
  {
    TraceSpan span("backward", device);
    loss.backward();
  }
  TraceSpan span("optimizer step", device);
  optimizer.step();
  return loss;
}

std::shared_ptr<data::DataLoader> shard_loader(const data::DataLoader& loader, bool training, int shards, int index) {
  const int64_t n = static_cast<int64_t>(loader.dataset()->size());
  data::DataLoaderOptions options = loader.options();
  std::shared_ptr<data::Sampler> sampler;
  if (training) {
    sampler = std::make_shared<data::DistributedSampler>(n, shards, index, options.shuffle, options.seed);
  } else {
    sampler = std::make_shared<data::DistributedEvalSampler>(n, shards, index);
  }
  options.shuffle = false;  // the sampler shuffles
  return std::make_shared<data::DataLoader>(loader.dataset(), options, std::move(sampler));
}

std::shared_ptr<nn::Module> SingleDevice::prepare_model(std::shared_ptr<nn::Module> model) {
  if (device_) model->to(*device_);
  else device_ = model->device();
  return model;
}

Device SingleDevice::input_device() const {
  WEFT_CHECK(device_.has_value(), "SingleDevice: input_device() before prepare()");
  return *device_;
}

}  // namespace weft::train
