// Adam and AdamW: checks, state and the call of the fused kernel.
#include "nn/optim/adam.h"

#include <cmath>

#include "kernels/optim_kernels.h"

namespace weft::optim {

namespace {

constexpr size_t kExpAvg = 0, kExpAvgSq = 1, kMaxExpAvgSq = 2;

AdamOptions to_adam(const AdamWOptions& o) { return {o.lr, o.betas, o.eps, o.weight_decay, o.amsgrad, o.maximize}; }

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  return {ParamGroup{std::move(params), std::nullopt}};
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Adam("Adam", one_group(std::move(params)), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options)
    : Adam("Adam", std::move(groups), options, false) {}

Adam::Adam(std::string name, std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled_weight_decay)
    : MultiTensorOptimizer(std::move(name), std::move(groups), options.lr, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
                           /*counts_steps=*/true),
      options_(options),
      decoupled_weight_decay_(decoupled_weight_decay) {
  check(options_);
}

void Adam::check(const AdamOptions& o) const {
  check_hyperparameter(o.lr >= 0, "learning rate", o.lr, "must be >= 0");
  check_hyperparameter(o.eps >= 0, "epsilon value", o.eps, "must be >= 0");
  check_hyperparameter(o.betas.first >= 0 && o.betas.first < 1, "beta parameter at index 0", o.betas.first,
                       "must be in [0, 1)");
  check_hyperparameter(o.betas.second >= 0 && o.betas.second < 1, "beta parameter at index 1", o.betas.second,
                       "must be in [0, 1)");
  check_hyperparameter(o.weight_decay >= 0, "weight_decay value", o.weight_decay, "must be >= 0");
}

AdamOptions Adam::options() const {
  AdamOptions o = options_;
  o.lr = lr();
  return o;
}

void Adam::update(const StepGroup& group) {
  std::vector<Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;
  for (size_t k = 0; k < group.index.size(); ++k) {
    ParamState& s = state(group.index[k]);
    if (!s.slots[kExpAvg].defined()) {
      s.slots[kExpAvg] = zeros_like(group.params[k]);
      s.slots[kExpAvgSq] = zeros_like(group.params[k]);
    }
    if (options_.amsgrad && !s.slots[kMaxExpAvgSq].defined()) s.slots[kMaxExpAvgSq] = zeros_like(group.params[k]);
    exp_avgs.push_back(s.slots[kExpAvg]);
    exp_avg_sqs.push_back(s.slots[kExpAvgSq]);
    if (options_.amsgrad) max_exp_avg_sqs.push_back(s.slots[kMaxExpAvgSq]);
    steps.push_back(++s.step);
  }
  AdamHyper hyper{lr(),
                  options_.betas.first,
                  options_.betas.second,
                  options_.eps,
                  group.weight_decay.value_or(options_.weight_decay),
                  options_.amsgrad,
                  options_.maximize,
                  decoupled_weight_decay_};
  adam_step_stub(group.device, group.params, group.grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, hyper);
}

std::map<std::string, double> Adam::hyperparameters() const {
  return {{"beta1", options_.betas.first},
          {"beta2", options_.betas.second},
          {"eps", options_.eps},
          {"weight_decay", options_.weight_decay},
          {"amsgrad", options_.amsgrad ? 1.0 : 0.0},
          {"maximize", options_.maximize ? 1.0 : 0.0},
          {"decoupled_weight_decay", decoupled_weight_decay_ ? 1.0 : 0.0}};
}

AdamOptions Adam::from_scalars(const std::map<std::string, double>& s) {
  AdamOptions o;
  o.lr = s.at("lr");
  o.betas = {s.at("beta1"), s.at("beta2")};
  o.eps = s.at("eps");
  o.weight_decay = s.at("weight_decay");
  o.amsgrad = s.at("amsgrad") != 0;
  o.maximize = s.at("maximize") != 0;
  return o;
}

void Adam::check_hyperparameters(const std::map<std::string, double>& scalars) const {
  bool decoupled = scalars.at("decoupled_weight_decay") != 0;
  WEFT_CHECK(decoupled == decoupled_weight_decay_, name(), ".load_state_dict: the state was saved by ",
             decoupled ? "AdamW" : "Adam", " (decoupled_weight_decay = ", decoupled ? 1 : 0, "), not by ", name());
  check(from_scalars(scalars));
}

void Adam::set_hyperparameters(const std::map<std::string, double>& scalars) { options_ = from_scalars(scalars); }

void Adam::check_state(const std::vector<ParamState>& state, const std::map<std::string, double>& scalars) const {
  const bool amsgrad = scalars.at("amsgrad") != 0;
  for (size_t i = 0; i < state.size(); ++i) {
    const ParamState& s = state[i];
    bool moments = s.slots[kExpAvg].defined() && s.slots[kExpAvgSq].defined();
    bool any = s.slots[kExpAvg].defined() || s.slots[kExpAvgSq].defined() || s.slots[kMaxExpAvgSq].defined();
    const std::string p = std::to_string(i);
    if (s.step == 0) {
      WEFT_CHECK(!any, name(), ".load_state_dict: parameter ", i, " has state tensors but no scalar '", p, ".step'");
      continue;
    }
    WEFT_CHECK(moments, name(), ".load_state_dict: parameter ", i, " has taken ", s.step,
               " steps but the state lacks '", p, s.slots[kExpAvg].defined() ? ".exp_avg_sq'" : ".exp_avg'");
    WEFT_CHECK(!amsgrad || s.slots[kMaxExpAvgSq].defined(), name(), ".load_state_dict: amsgrad is on and parameter ", i,
               " has taken ", s.step, " steps but the state lacks '", p, ".max_exp_avg_sq'");
  }
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Adam("AdamW", one_group(std::move(params)), to_adam(options), true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Adam("AdamW", std::move(groups), to_adam(options), true) {}

AdamWOptions AdamW::options() const {
  AdamOptions o = Adam::options();
  return {o.lr, o.betas, o.eps, o.weight_decay, o.amsgrad, o.maximize};
}

}  // namespace weft::optim
