// PipelineStrategy: the model as a Sequential, split into stages over the devices.
#include "train/pipeline_strategy.h"

#include "core/error.h"
#include "core/trace.h"
#include "nn/sequential.h"

namespace weft::train {

std::shared_ptr<nn::Sequential> pipeline_sequential(const std::shared_ptr<nn::Module>& model) {
  if (auto seq = model->as_sequential()) return seq;
  WEFT_FAIL("pipeline mode: a ", model->type_name(), " cannot be split into stages; give an nn::Sequential (ConvNet "
            "and ResNet convert themselves with as_sequential())");
}

PipelineStrategy::PipelineStrategy(PipelineStrategyOptions options) : options_(std::move(options)) {
  WEFT_CHECK(!options_.devices.empty(), "PipelineStrategy: no devices given");
}

std::shared_ptr<nn::Module> PipelineStrategy::prepare_model(std::shared_ptr<nn::Module> model) {
  return pipeline_ = std::make_shared<parallel::pipeline::Pipeline>(
      pipeline_sequential(model), parallel::pipeline::PipelineOptions{.devices = options_.devices,
                                                                .balance = options_.balance,
                                                                .balance_by = options_.balance_by,
                                                                .micro_batches = options_.micro_batches,
                                                                .schedule = options_.schedule,
                                                                .virtual_stages = options_.virtual_stages,
                                                                .activation_checkpointing =
                                                                    options_.activation_checkpointing,
                                                                .output_device = options_.devices[0]});
}

parallel::pipeline::Pipeline& PipelineStrategy::pipeline() const {
  WEFT_CHECK(pipeline_ != nullptr, "PipelineStrategy: pipeline() before prepare()");
  return *pipeline_;
}

Tensor PipelineStrategy::train_step(const data::Batch& batch, const Criterion& criterion,
                                    optim::Optimizer& optimizer) {
  optimizer.zero_grad();
  Tensor loss = pipeline().step(batch.data, batch.target, criterion).loss;
  TraceSpan span("optimizer step", input_device());
  optimizer.step();
  return loss;
}

std::vector<size_t> PipelineStrategy::stage_layers() const {
  return pipeline_ ? pipeline_->balance() : std::vector<size_t>{};
}

}  // namespace weft::train
