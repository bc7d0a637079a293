// Adam and AdamW with torch.optim.Adam / AdamW's update rules (written out in
// kernels/optim_kernels.h, AdamHyper): bias-corrected moments, optional AMSGrad, and
// weight decay either added to the gradient (Adam, L2) or decoupled (AdamW:
// param *= 1 - lr * weight_decay before the update).
//
// State per parameter that has taken a step: "<i>.exp_avg", "<i>.exp_avg_sq",
// "<i>.max_exp_avg_sq" (AMSGrad only) and the scalar "<i>.step". Step counts are per
// parameter, as in PyTorch: a parameter skipped for lack of a grad does not advance.
//
// Parameter groups may set their own weight decay (nn/optim/param_group.h): nanoGPT's AdamW
// is AdamW(weight_decay_groups(model, 0.1), AdamWOptions(6e-4, {0.9, 0.95})), stepped as
// two AdamWs, one with decay 0.1 over the matrices and one with none over the rest, would be.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/optim/multi_tensor_optimizer.h"

namespace weft::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
};

// The same fields as AdamOptions; only the default weight decay differs (PyTorch's).
// Built from an AdamOptions, it takes every value as given (weight_decay included).
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  AdamWOptions(double lr_ = 1e-3, std::pair<double, double> betas_ = {0.9, 0.999}, double eps_ = 1e-8,
               double weight_decay_ = 1e-2, bool amsgrad_ = false, bool maximize_ = false)
      : lr(lr_), betas(betas_), eps(eps_), weight_decay(weight_decay_), amsgrad(amsgrad_), maximize(maximize_) {}
};

class Adam : public MultiTensorOptimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options);

  // The options in force (lr included: set_lr and load_state_dict change it).
  AdamOptions options() const;

 protected:
  // AdamW's constructor: decoupled weight decay under another name.
  Adam(std::string name, std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled_weight_decay);

  void update(const StepGroup& group) override;
  std::map<std::string, double> hyperparameters() const override;
  void check_hyperparameters(const std::map<std::string, double>& scalars) const override;
  void set_hyperparameters(const std::map<std::string, double>& scalars) override;
  void check_state(const std::vector<ParamState>& state, const std::map<std::string, double>& scalars) const override;

 private:
  void check(const AdamOptions& options) const;
  static AdamOptions from_scalars(const std::map<std::string, double>& scalars);

  AdamOptions options_;  // lr lives in the base class
  bool decoupled_weight_decay_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);

  AdamWOptions options() const;
};

}  // namespace weft::optim
