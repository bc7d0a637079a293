// LayerNorm: parameters and the call of the fused kernel.
#include "nn/layer_norm.h"

#include <sstream>

#include "kernels/layer_norm.h"

namespace weft::nn {

LayerNorm::LayerNorm(int64_t normalized_size, double eps, bool elementwise_affine, bool bias,
                     const TensorOptions& options)
    : Cloneable("LayerNorm"), normalized_size_(normalized_size), eps_(eps) {
  WEFT_CHECK(normalized_size > 0, "LayerNorm: normalized_size must be positive, got ", normalized_size);
  WEFT_CHECK(eps >= 0, "LayerNorm: eps must be non-negative, got ", eps);
  WEFT_CHECK(is_floating(options.dtype), "LayerNorm: parameters need a floating dtype, got ", options.dtype);
  const TensorOptions opts(options.dtype, options.device);
  if (elementwise_affine) {
    register_parameter("weight", ones({normalized_size}, opts));
    if (bias) register_parameter("bias", zeros({normalized_size}, opts));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layer_norm(input, {normalized_size_}, has_param("weight") ? param("weight") : Tensor(),
                    has_param("bias") ? param("bias") : Tensor(), eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream out;
  out << "(" << normalized_size_ << ",), eps=" << eps_
      << ", elementwise_affine=" << (has_param("weight") ? "true" : "false")
      << ", bias=" << (has_param("bias") ? "true" : "false");
  return out.str();
}

}  // namespace weft::nn
