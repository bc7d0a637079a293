// MultiTensorOptimizer: the base of SGD, Adam and AdamW, whose updates are elementwise and
// whose state lives beside the parameters (nn/optim/optimizer.h says what every optimizer is).
//
// step() groups the parameters that have a grad by (device, dtype, weight decay) and runs one
// multi-tensor kernel (kernels/optim_kernels.h) per group, so that on CUDA a step is one
// launch per device (two with nanoGPT's decay / no-decay groups), not one launch per tensor.
// The parameters may live on several devices (model and pipeline parallelism put one model
// on many): every update is elementwise, so a parameter ends bit-identical to what an
// optimizer of its device alone would make of it, or an optimizer of any subset of the
// parameters (what parallel::ZeroRedundancyOptimizer relies on).
//
// Parameter groups (nn/optim/param_group.h): each parameter decays by its group's weight
// decay, or by the optimizer's where its group sets none; everything else is the optimizer's.
// A step group never mixes two decays, so a parameter's update is bit for bit what an
// optimizer with that decay alone would make.
//
// State: per parameter, a step count (optimizers that count steps) and one tensor per slot
// name ("momentum_buffer"; "exp_avg", "exp_avg_sq", ...), each created when first needed;
// the weight decay of each parameter whose group sets one; saved in the form optimizer.h
// describes. load_state_dict() restores the hyperparameters too, as PyTorch does; loading
// and then stepping gives bit-identical results to never having stopped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/optim/optimizer.h"
#include "nn/optim/param_group.h"

namespace weft::optim {

class MultiTensorOptimizer : public Optimizer {
 public:
  void step() final;
  OptimizerState state_dict() const final;
  void load_state_dict(const OptimizerState& state) final;

  // The weight decay of parameter i's group; unset where the group sets none (the parameter
  // decays by the optimizer's).
  std::optional<double> group_weight_decay(size_t param) const { return weight_decay_.at(param); }

 protected:
  // slot_names: the per-parameter state tensors, e.g. {"exp_avg", "exp_avg_sq"}. The
  // parameters are the groups' in order (params_of); a group may be empty, all of them not.
  MultiTensorOptimizer(std::string name, std::vector<ParamGroup> groups, double lr,
                       std::vector<std::string> slot_names, bool counts_steps);

  struct ParamState {
    int64_t step = 0;
    std::vector<Tensor> slots;  // one per slot name; undefined until first needed
  };

  // The parameters of one step that share a device, a dtype and a group weight decay (one
  // step group in the usual case), with the contiguous tensors the kernel writes (params)
  // and reads (grads).
  struct StepGroup {
    std::vector<size_t> index;  // into params()
    std::vector<Tensor> params;
    std::vector<Tensor> grads;
    Device device;
    std::optional<double> weight_decay;  // the parameters' group's; unset: the optimizer's
  };
  // Runs the kernel once over the group, creating state it needs.
  virtual void update(const StepGroup& group) = 0;

  // Hyperparameters other than lr, as scalars (booleans 0 / 1).
  virtual std::map<std::string, double> hyperparameters() const = 0;
  // Throws if the values in `scalars` (every key of hyperparameters() is present) are
  // not acceptable to this optimizer; changes nothing.
  virtual void check_hyperparameters(const std::map<std::string, double>& scalars) const = 0;
  virtual void set_hyperparameters(const std::map<std::string, double>& scalars) = 0;
  // Throws if a loaded state is incomplete under the loaded hyperparameters.
  virtual void check_state(const std::vector<ParamState>& state, const std::map<std::string, double>& scalars) const {}

  ParamState& state(size_t param) { return state_[param]; }
  const std::vector<std::string>& slot_names() const { return slot_names_; }

 private:
  void check_state_matches(size_t param) const;

  std::vector<std::string> slot_names_;
  bool counts_steps_;
  std::vector<ParamState> state_;
  std::vector<std::optional<double>> weight_decay_;  // per parameter: its group's
};

}  // namespace weft::optim
