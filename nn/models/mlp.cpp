// MLP: Flatten, then (Linear, ReLU, Dropout) per hidden width, then the classifier.
#include "nn/models/mlp.h"

#include <memory>

#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/sequential.h"

namespace weft::nn {

MLP::MLP(int64_t in_features, const std::vector<int64_t>& hidden, int64_t num_classes, double dropout,
         Generator* gen)
    : Cloneable("MLP"), in_features_(in_features) {
  WEFT_CHECK(in_features > 0 && num_classes > 0, "MLP: in_features and num_classes must be positive, got ",
             in_features, " and ", num_classes);
  register_module("flatten", std::make_shared<Flatten>());
  auto layers = std::make_shared<Sequential>();
  int64_t width = in_features;
  for (int64_t h : hidden) {
    WEFT_CHECK(h > 0, "MLP: hidden widths must be positive, got ", h);
    layers->push_back(std::make_shared<Linear>(width, h, true, TensorOptions(), gen));
    layers->push_back(std::make_shared<ReLU>());
    layers->push_back(std::make_shared<Dropout>(dropout));
    width = h;
  }
  layers->push_back(std::make_shared<Linear>(width, num_classes, true, TensorOptions(), gen));
  register_module("layers", std::move(layers));
}

Tensor MLP::forward(const Tensor& input) {
  Tensor x = child("flatten")(input);
  WEFT_CHECK(x.dim() == 2 && x.size(1) == in_features_, "MLP: expected ", in_features_,
             " features per sample, got input of shape ", input.shape());
  return child("layers")(x);
}

}  // namespace weft::nn
