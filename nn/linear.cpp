// Linear: parameters, PyTorch's default initialisation and F.linear.
#include "nn/linear.h"

#include <cmath>
#include <sstream>

#include "kernels/linalg.h"
#include "nn/init.h"

namespace weft::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const TensorOptions& options, Generator* gen)
    : Cloneable("Linear"), in_features_(in_features), out_features_(out_features) {
  WEFT_CHECK(in_features >= 0 && out_features >= 0, "Linear: in_features and out_features must be non-negative, got ",
             in_features, " and ", out_features);
  WEFT_CHECK(is_floating(options.dtype), "Linear: parameters need a floating dtype, got ", options.dtype);
  const TensorOptions opts(options.dtype, options.device);
  const Tensor& weight = register_parameter("weight", empty({out_features, in_features}, opts));
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyRelu, gen);
  if (bias) {
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    init::uniform_(register_parameter("bias", empty({out_features}, opts)), -bound, bound, gen);
  }
}

Tensor Linear::forward(const Tensor& input) {
  return linear(input, param("weight"), has_param("bias") ? param("bias") : Tensor());
}

std::string Linear::extra_repr() const {
  std::ostringstream out;
  out << "in_features=" << in_features_ << ", out_features=" << out_features_
      << ", bias=" << (has_param("bias") ? "true" : "false");
  return out.str();
}

}  // namespace weft::nn
