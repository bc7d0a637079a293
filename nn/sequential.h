// Sequential (torch.nn.Sequential): children named "0", "1", ... applied in order, so that
// a PyTorch nn.Sequential and a weft one produce the same state_dict names; or named as
// given (torch's Sequential(OrderedDict)), which lets a model be written as a Sequential of
// its own layers with its own state_dict names (ConvNet::as_sequential()).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace weft::nn {

class Sequential : public Cloneable<Sequential> {
 public:
  Sequential() : Cloneable("Sequential") {}
  // Sequential(conv, relu, pool), also through std::make_shared<Sequential>(conv, relu, pool).
  template <class... Modules>
  explicit Sequential(std::shared_ptr<Modules>... modules) : Cloneable("Sequential") {
    (push_back(std::move(modules)), ...);
  }
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  // Appends a module under the next index, or under `name`.
  void push_back(std::shared_ptr<Module> module);
  void push_back(std::string name, std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }
  bool empty() const { return size() == 0; }
  // The module at `index` (an error past the end).
  Module& operator[](size_t index) const;
  // The identity for an empty Sequential, as in PyTorch.
  Tensor forward(const Tensor& input) override;
  // A Sequential of the same children under the same names.
  std::shared_ptr<Sequential> as_sequential() const override;
};

// `model`'s children in order (shared, not copied) under their names, with a Flatten put
// before the one named `flatten_before`: the Sequential form of a model whose forward
// applies its children one after the other and flattens before its classifier (ConvNet,
// ResNet), with the model's state_dict names.
std::shared_ptr<Sequential> children_as_sequential(const Module& model, const std::string& flatten_before);

}  // namespace weft::nn
