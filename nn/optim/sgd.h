// SGD: stochastic gradient descent with momentum, dampening, Nesterov momentum, L2
// weight decay and maximize, with torch.optim.SGD's update rule (written out in
// kernels/optim_kernels.h, SgdHyper) and its argument checks.
//
// State: "<i>.momentum_buffer" for each parameter that has taken a step with
// momentum != 0. No step counts (PyTorch's SGD keeps none). Parameter groups may set their
// own weight decay (nn/optim/param_group.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nn/optim/multi_tensor_optimizer.h"

namespace weft::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

class SGD : public MultiTensorOptimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);

  // The options in force (lr included: set_lr and load_state_dict change it).
  SGDOptions options() const;

 protected:
  void update(const StepGroup& group) override;
  std::map<std::string, double> hyperparameters() const override;
  void check_hyperparameters(const std::map<std::string, double>& scalars) const override;
  void set_hyperparameters(const std::map<std::string, double>& scalars) override;

 private:
  void check(const SGDOptions& options) const;
  static SGDOptions from_scalars(const std::map<std::string, double>& scalars);

  SGDOptions options_;  // lr lives in the base class
};

}  // namespace weft::optim
