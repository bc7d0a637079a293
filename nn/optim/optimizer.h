// Optimizer: what every optimizer of weft::optim is (PyTorch's torch.optim.Optimizer).
//
// An optimizer holds handles to leaf parameters and updates them in place: step() reads
// each parameter's .grad (parameters whose grad is undefined are skipped, as in PyTorch).
// lr() / set_lr() act on every parameter, so one scheduler drives an optimizer. Parameter
// groups (nn/optim/param_group.h) may set their own weight decay and nothing else: the
// other hyperparameters are the optimizer's (make two optimizers where PyTorch's groups
// differ in more).
//
// Two kinds derive from it: MultiTensorOptimizer (nn/optim/multi_tensor_optimizer.h), the
// base of SGD, Adam and AdamW, whose state lives beside its parameters; and
// parallel::ZeroRedundancyOptimizer, which runs one of those on each process over a shard
// of the parameters, so that its state is spread over the processes of a job.
//
// State for checkpoints and resume is a flat list of named tensors plus named scalars,
// the shape safetensors stores (tensors by name, scalars in the metadata):
//   tensors  "<param index>.<state name>": "3.momentum_buffer", "0.exp_avg", ...; each
//            shaped like its parameter
//   scalars  "lr", the other hyperparameters ("momentum", "beta1", ...; booleans as
//            0 / 1), "num_params", "<param index>.step" (optimizers that count steps),
//            "<param index>.weight_decay" (each parameter whose group sets a weight decay;
//            the others decay by "weight_decay"), "initial_lr" (once a learning-rate
//            scheduler has been made).
// Indices are positions in params(). Loading checks that the groups match: a parameter has
// "<i>.weight_decay" in the state exactly where its group sets a decay here (the value is
// the state's, as for every hyperparameter). Per-parameter keys survive sharding, so a
// sharded optimizer's consolidated state has the same form as its wrapped optimizer's, and
// checkpoints move between the two freely.
#pragma once

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

// What an optimizer's step() does beyond this process: Local steps this rank's parameters alone
// (every optimizer of nn/optim); the others are data-parallel wrappers whose step() is a
// collective, which a strategy that needs each rank to step on its own (a pipeline's stages,
// local SGD's replicas) refuses by name.
enum class StepScope {
  Local,
  ShardedAcrossRanks,  // each rank steps a shard, then the shards are broadcast (ZeRO)
  AveragesReplicas,    // the replicas' parameters are averaged after some steps (post-local SGD)
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
  virtual void step() = 0;
  virtual StepScope step_scope() const { return StepScope::Local; }
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

  // Every process of a job calls this before process `to` calls state_dict() (a
  // checkpoint): an optimizer whose state is spread over the processes gathers it on
  // `to` (a collective); one that holds its whole state, as every optimizer of a single
  // process does, has nothing to do.
  virtual void consolidate_state_dict(int to = 0) {}
  // State tensors are detached aliases of the optimizer's own (clone them to keep a
  // snapshot while training goes on).
  virtual OptimizerState state_dict() const = 0;
  // Checks everything before changing anything: a state from another optimizer type,
  // for another number of parameters, with a mis-shaped or unknown tensor, is an error
  // that names the problem. Each tensor is copied onto its own parameter's device and
  // dtype, whatever device it was saved from.
  virtual void load_state_dict(const OptimizerState& state) = 0;

 protected:
  // Checks that the parameters are distinct leaves that require grad, and the lr.
  Optimizer(std::string name, std::vector<Tensor> params, double lr);

  // "<name>: invalid <what>: <value> (<rule>)": the constructors' checks.
  void check_hyperparameter(bool ok, const char* what, double value, const char* rule) const;

 private:
  std::string name_;
  std::vector<Tensor> params_;
  double lr_;
  std::optional<double> initial_lr_;
};

}  // namespace weft::optim
