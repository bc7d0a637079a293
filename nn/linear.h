// Linear: y = x W^T + b (torch.nn.Linear), with PyTorch's default initialisation.
#pragma once

#include <cstdint>

#include "core/generator.h"
#include "nn/module.h"

namespace weft::nn {

// Parameters "weight" [out_features, in_features] and, with bias, "bias" [out_features].
// Initialised as PyTorch's reset_parameters(): weight by kaiming_uniform_(a = sqrt(5)),
// i.e. U(-1/sqrt(in_features), 1/sqrt(in_features)), and bias from the same range, drawn
// from `gen` (default generator when null) in that order. `options` gives the dtype and
// device (its requires_grad is ignored: parameters always require grad).
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, const TensorOptions& options = {},
         Generator* gen = nullptr);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
};

}  // namespace weft::nn
