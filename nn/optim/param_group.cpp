// Parameter groups: nanoGPT's weight-decay split, and groups cut down to a shard.
#include "nn/optim/param_group.h"

#include <cstdint>
#include <unordered_map>

#include "core/error.h"
#include "nn/module.h"

namespace weft::optim {

std::vector<Tensor> params_of(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor> out;
  for (const ParamGroup& g : groups) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

std::vector<ParamGroup> weight_decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                            double weight_decay) {
  ParamGroup decay{{}, weight_decay}, no_decay{{}, 0.0};
  for (const auto& [name, p] : named_params) {
    WEFT_CHECK(p.defined(), "weight_decay_groups: parameter '", name, "' is an undefined tensor");
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  }
  std::vector<ParamGroup> groups;
  for (ParamGroup* g : {&decay, &no_decay})
    if (!g->params.empty()) groups.push_back(std::move(*g));
  return groups;
}

std::vector<ParamGroup> weight_decay_groups(const nn::Module& module, double weight_decay) {
  return weight_decay_groups(module.named_parameters(), weight_decay);
}

std::vector<ParamGroup> restrict_groups(const std::vector<ParamGroup>& groups, const std::vector<Tensor>& params) {
  std::unordered_map<const TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) group_of.try_emplace(p.impl(), g);
  std::vector<ParamGroup> out;
  size_t previous = SIZE_MAX;  // the group of the parameter before
  for (size_t k = 0; k < params.size(); ++k) {
    auto found = group_of.find(params[k].impl());
    WEFT_CHECK(found != group_of.end(), "restrict_groups: tensor ", k, " of the ", params.size(),
               " given is in none of the ", groups.size(), " parameter groups");
    if (found->second != previous) out.push_back(ParamGroup{{}, groups[found->second].weight_decay});
    out.back().params.push_back(params[k]);
    previous = found->second;
  }
  return out;
}

}  // namespace weft::optim
