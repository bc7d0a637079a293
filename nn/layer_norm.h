// LayerNorm (torch.nn.LayerNorm) over the last dim: y = (x - mean) / sqrt(var + eps) * weight
// + bias, per row (kernels/layer_norm.h).
#pragma once

#include <cstdint>
#include <string>

#include "nn/module.h"

namespace weft::nn {

// Parameters, with elementwise_affine: "weight" = 1 and (with bias) "bias" = 0, both
// [normalized_size]. weft normalises over one trailing dim (what transformers use); PyTorch's
// normalized_shape of several dims is the kernel's (weft::layer_norm), not this layer's.
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                     const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t normalized_size() const { return normalized_size_; }
  double eps() const { return eps_; }

 private:
  int64_t normalized_size_;
  double eps_;
};

}  // namespace weft::nn
