// Sequential (torch.nn.Sequential): children named "0", "1", ... applied in order, so that
// a PyTorch nn.Sequential and a weft one produce the same state_dict names.
#pragma once

#include <cstddef>
#include <memory>
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

  // Appends a module under the next index.
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }
  bool empty() const { return size() == 0; }
  // The module at `index` (an error past the end).
  Module& operator[](size_t index) const;
  // The identity for an empty Sequential, as in PyTorch.
  Tensor forward(const Tensor& input) override;
};

}  // namespace weft::nn
