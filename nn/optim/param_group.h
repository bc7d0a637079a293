// ParamGroup: parameters of one optimizer that share a weight decay (PyTorch's param_groups,
// with the one hyperparameter a weft group may set; the learning rate and the rest are the
// optimizer's, so one scheduler drives every group).
//
// nanoGPT trains a GPT with two groups, built by its configure_optimizers and here by
// weight_decay_groups(): matrices and embeddings (dim >= 2) decay, biases and norm gains
// (dim < 2) do not, since shrinking a bias or a gain toward 0 is no regularisation:
//
//   optim::AdamW opt(optim::weight_decay_groups(*model, 0.1), optim::AdamWOptions(6e-4, {0.9, 0.95}));
//
// An optimizer numbers its parameters through its groups in order (params_of), and its state
// names them by that number (nn/optim/optimizer.h). Under parallel::ZeroRedundancyOptimizer
// each rank's optimizer holds a shard of the parameters; restrict_groups gives the shard the
// decay of each of its parameters:
//
//   auto groups = optim::weight_decay_groups(*model, 0.1);
//   parallel::ZeroRedundancyOptimizer zero(optim::params_of(groups), [groups](std::vector<Tensor> shard) {
//     return std::make_shared<optim::AdamW>(optim::restrict_groups(groups, shard), optim::AdamWOptions(6e-4));
//   });
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace weft::nn {
class Module;
}

namespace weft::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> weight_decay;  // unset: the optimizer's (its options' weight_decay)
};

// Every group's parameters, group after group: the order of the optimizer's params().
std::vector<Tensor> params_of(const std::vector<ParamGroup>& groups);

// nanoGPT's split: the parameters with dim() >= 2 decay by `weight_decay`, the others by 0;
// those that do not require grad are left out (as nanoGPT does), each group keeps the order
// of the list, and a group with no parameter is left out. A module's parameters are its
// named_parameters() (each tied tensor once, nn/module.h).
std::vector<ParamGroup> weight_decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                            double weight_decay);
std::vector<ParamGroup> weight_decay_groups(const nn::Module& module, double weight_decay);

// The groups of `params` alone, in the order of `params` (a ZeroRedundancyOptimizer checks
// that its shard optimizer keeps the shard's order): each run of consecutive parameters from
// one group becomes a group with that group's weight decay. Every tensor of `params` must be
// in `groups`; an error names the first that is not.
std::vector<ParamGroup> restrict_groups(const std::vector<ParamGroup>& groups, const std::vector<Tensor>& params);

}  // namespace weft::optim
