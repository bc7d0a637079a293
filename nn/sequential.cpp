// Sequential: children under their index, applied in order.
#include "nn/sequential.h"

#include <string>

#include "nn/activation.h"

namespace weft::nn {

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Cloneable("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  WEFT_CHECK(module != nullptr, "Sequential: cannot add a null module at index ", size());
  register_module(std::to_string(size()), std::move(module));
}

void Sequential::push_back(std::string name, std::shared_ptr<Module> module) {
  WEFT_CHECK(module != nullptr, "Sequential: cannot add a null module as '", name, "'");
  register_module(std::move(name), std::move(module));
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

std::shared_ptr<Sequential> Sequential::as_sequential() const { return children_as_sequential(*this, ""); }

std::shared_ptr<Sequential> children_as_sequential(const Module& model, const std::string& flatten_before) {
  auto seq = std::make_shared<Sequential>();
  for (const auto& [name, layer] : model.named_children()) {
    if (name == flatten_before) seq->push_back("flatten", std::make_shared<Flatten>());
    seq->push_back(name, layer);
  }
  return seq;
}

}  // namespace weft::nn
