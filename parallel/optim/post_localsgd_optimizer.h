// PostLocalSGDOptimizer: an optimizer that averages the replicas after its steps (PyTorch's
// torch.distributed.optim.PostLocalSGDOptimizer): each step() is the wrapped optimizer's
// step, then the averager's call (parallel/optim/model_averaging.h), which averages the parameters
// over the ranks every so many steps. What local SGD (parallel/ddp/post_localsgd_hook.h) trains
// with:
//
//   parallel::PostLocalSGDOptimizer optimizer(
//       std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.01, 0.9}),
//       std::make_shared<parallel::PeriodicModelAverager>(/*period=*/4, /*warmup_steps=*/100));
//
// Its state is the wrapped optimizer's, plus the scalar "averager_step": the averager's count,
// so that a resumed job averages at the same steps. Loading a state without it (saved by the
// plain optimizer) starts that count at 0 and says so, as PyTorch's does.
//
// The learning rate: PyTorch's wrapper shares its parameter groups with the wrapped optimizer,
// so a scheduler may act on either. Here each keeps a rate, and each step brings them level: a
// change made on one side since the last step wins; changes to both, to different rates, are
// an error (one scheduler should own the rate).
#pragma once

#include <memory>

#include "nn/optim/optimizer.h"
#include "parallel/optim/model_averaging.h"

namespace weft::parallel {

class PostLocalSGDOptimizer final : public optim::Optimizer {
 public:
  // Takes the wrapped optimizer's parameters, rate and name ("PostLocalSGDOptimizer(SGD)").
  PostLocalSGDOptimizer(std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<ModelAverager> averager);

  // The wrapped optimizer's step, then averager().average_parameters(params()): every rank
  // calls it, at the same steps.
  void step() override;
  optim::StepScope step_scope() const override { return optim::StepScope::AveragesReplicas; }
  void consolidate_state_dict(int to = 0) override { optimizer_->consolidate_state_dict(to); }
  optim::OptimizerState state_dict() const override;
  void load_state_dict(const optim::OptimizerState& state) override;

  optim::Optimizer& optimizer() const { return *optimizer_; }
  ModelAverager& averager() const { return *averager_; }

 private:
  // The rate the next step uses (see above); throws when both sides changed it differently.
  double current_lr() const;

  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<ModelAverager> averager_;
  double synced_lr_;  // the rate both sides had after the last step (or construction, or load)
};

}  // namespace weft::parallel
