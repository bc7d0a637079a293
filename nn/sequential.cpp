// Sequential: children under their index, applied in order.
#include "nn/sequential.h"

#include <string>

namespace weft::nn {

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Cloneable("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  WEFT_CHECK(module != nullptr, "Sequential: cannot add a null module at index ", size());
  register_module(std::to_string(size()), std::move(module));
}

Module& Sequential::operator[](size_t index) const {
  WEFT_CHECK(index < size(), "Sequential: index ", index, " is out of range for ", size(), " modules");
  return *named_children()[index].second;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, m] : named_children()) x = m->forward(x);
  return x;
}

}  // namespace weft::nn
