// An optimizer whose steps are followed by a model averager's; see post_localsgd_optimizer.h.
#include "parallel/optim/post_localsgd_optimizer.h"

#include <cmath>
#include <iostream>
#include <optional>

#include "core/error.h"

namespace weft::parallel {

namespace {

constexpr const char* kAveragerStep = "averager_step";

// Each of the base's arguments goes through it: their order of evaluation is not fixed.
const optim::Optimizer& checked(const std::shared_ptr<optim::Optimizer>& optimizer) {
  WEFT_CHECK(optimizer != nullptr, "PostLocalSGDOptimizer: needs an optimizer to wrap");
  return *optimizer;
}

}  // namespace

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::shared_ptr<optim::Optimizer> optimizer,
                                             std::shared_ptr<ModelAverager> averager)
    : Optimizer("PostLocalSGDOptimizer(" + checked(optimizer).name() + ")", checked(optimizer).params(),
                checked(optimizer).lr()),
      optimizer_(std::move(optimizer)),
      averager_(std::move(averager)),
      synced_lr_(lr()) {
  WEFT_CHECK(averager_ != nullptr, name(), ": needs a model averager");
  if (optimizer_->initial_lr()) set_initial_lr(*optimizer_->initial_lr());
}

double PostLocalSGDOptimizer::current_lr() const {
  const double mine = lr(), theirs = optimizer_->lr();
  if (theirs == synced_lr_) return mine;
  WEFT_CHECK(mine == synced_lr_ || mine == theirs, name(), ": the learning rate was set to ", mine, " on the wrapper "
             "and to ", theirs, " on the wrapped ", optimizer_->name(), " since the last step: let one of them own it");
  return theirs;
}

void PostLocalSGDOptimizer::step() {
  const double rate = current_lr();
  set_lr(rate);
  optimizer_->set_lr(rate);
  synced_lr_ = rate;
  optimizer_->step();
  averager_->average_parameters(params());
}

optim::OptimizerState PostLocalSGDOptimizer::state_dict() const {
  optim::OptimizerState state = optimizer_->state_dict();
  state.scalars["lr"] = current_lr();
  if (initial_lr()) state.scalars["initial_lr"] = *initial_lr();  // else the wrapped one's, if a scheduler set it
  state.scalars[kAveragerStep] = static_cast<double>(averager_->step());
  return state;
}

void PostLocalSGDOptimizer::load_state_dict(const optim::OptimizerState& state) {
  optim::OptimizerState inner = state;
  std::optional<double> averager_step;
  if (auto it = inner.scalars.find(kAveragerStep); it != inner.scalars.end()) {
    averager_step = it->second;
    inner.scalars.erase(it);
    WEFT_CHECK(*averager_step >= 0 && *averager_step == std::floor(*averager_step) && *averager_step < 9.0e15, name(),
               ".load_state_dict: scalar '", kAveragerStep, "' must be a non-negative whole number, got ",
               *averager_step);
  }
  optimizer_->load_state_dict(inner);  // checks the rest, before anything changes here
  set_lr(optimizer_->lr());
  synced_lr_ = lr();
  if (optimizer_->initial_lr()) set_initial_lr(*optimizer_->initial_lr());
  if (!averager_step)
    std::cerr << "weft: " << name() << ".load_state_dict: the state has no '" << kAveragerStep
              << "' (saved by a plain " << optimizer_->name() << "?): the averager counts its steps from 0\n";
  averager_->set_step(averager_step ? static_cast<int64_t>(*averager_step) : 0);
}

}  // namespace weft::parallel
