// Optimizer: the base of weft::optim's optimizers (PyTorch's torch.optim.Optimizer).
//
// An optimizer holds handles to leaf parameters and updates them in place: step() reads
// each parameter's .grad (parameters whose grad is undefined are skipped, as in
// PyTorch) and runs one multi-tensor kernel (kernels/optim_kernels.h) per (device,
// dtype) group of them, so that on CUDA a step is one launch per device, not one launch
// per tensor. The parameters may live on several devices (model and pipeline
// parallelism put one model on many): every update is elementwise, so a parameter ends
// bit-identical to what an optimizer of its device alone would make of it. One
// parameter group per optimizer in PyTorch's sense: lr() / set_lr() act on all
// parameters (make two optimizers where PyTorch would use two groups).
//
// State for checkpoints and resume is a flat list of named tensors plus named scalars,
// the shape safetensors stores (tensors by name, scalars in the metadata):
//   tensors  "<param index>.<state name>": "3.momentum_buffer", "0.exp_avg", ...
//   scalars  "lr", the other hyperparameters ("momentum", "beta1", ...; booleans as
//            0 / 1), "num_params", "<param index>.step" (optimizers that count steps),
//            "initial_lr" (once a learning-rate scheduler has been made).
// load_state_dict() restores the hyperparameters too, as PyTorch does; loading and then
// stepping gives bit-identical results to never having stopped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace weft::optim {

struct OptimizerState {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "SGD", "Adam", "AdamW": what error messages and state checks call this optimizer.
  const std::string& name() const { return name_; }

  // One update of every parameter that has a grad; runs with grad mode off. Each grad
  // must match its parameter's shape, dtype and device.
  void step();
  // Sets every parameter's grad to none (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }

  // The learning rate that schedulers start from (PyTorch's param_group["initial_lr"]):
  // the first scheduler made on this optimizer sets it to the lr of that moment, so a
  // second scheduler (SequentialLR's parts) starts from the same value.
  std::optional<double> initial_lr() const { return initial_lr_; }
  void set_initial_lr(double lr) { initial_lr_ = lr; }

  // State tensors are detached aliases of the optimizer's own (clone them to keep a
  // snapshot while training goes on).
  OptimizerState state_dict() const;
  // Checks everything before changing anything: a state from another optimizer type,
  // for another number of parameters, with a mis-shaped or unknown tensor, is an error
  // that names the problem. Each tensor is copied onto its own parameter's device and
  // dtype, whatever device it was saved from.
  void load_state_dict(const OptimizerState& state);

 protected:
  // slot_names: the per-parameter state tensors, e.g. {"exp_avg", "exp_avg_sq"}.
  Optimizer(std::string name, std::vector<Tensor> params, double lr, std::vector<std::string> slot_names,
            bool counts_steps);

  struct ParamState {
    int64_t step = 0;
    std::vector<Tensor> slots;  // one per slot name; undefined until first needed
  };

  // The parameters of one step that share a device and a dtype (one group in the usual
  // case), with the contiguous tensors the kernel writes (params) and reads (grads).
  struct StepGroup {
    std::vector<size_t> index;  // into params()
    std::vector<Tensor> params;
    std::vector<Tensor> grads;
    Device device;
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
  // "<name>: invalid <what>: <value> (<rule>)": the constructors' checks.
  void check_hyperparameter(bool ok, const char* what, double value, const char* rule) const;

 private:
  void check_state_matches(size_t param) const;

  std::string name_;
  std::vector<Tensor> params_;
  double lr_;
  std::optional<double> initial_lr_;
  std::vector<std::string> slot_names_;
  bool counts_steps_;
  std::vector<ParamState> state_;
};

}  // namespace weft::optim
