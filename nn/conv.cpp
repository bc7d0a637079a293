// Conv2d: argument checks at construction, PyTorch's default initialisation, F.conv2d.
#include "nn/conv.h"

#include <cmath>
#include <sstream>

#include "kernels/conv.h"
#include "nn/init.h"

namespace weft::nn {

std::string Int2::str() const {
  std::ostringstream out;
  out << "(" << h << ", " << w << ")";
  return out.str();
}

std::string Int2::short_str() const { return h == w ? std::to_string(h) : str(); }

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, Int2 stride, Int2 padding,
               Int2 dilation, int64_t groups, bool bias, const TensorOptions& options, Generator* gen)
    : Cloneable("Conv2d"),
      in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_size_(kernel_size),
      stride_(stride),
      padding_(padding),
      dilation_(dilation),
      groups_(groups) {
  WEFT_CHECK(groups > 0, "Conv2d: groups must be positive, got ", groups);
  WEFT_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: in_channels and out_channels must be positive, got ",
             in_channels, " and ", out_channels);
  WEFT_CHECK(in_channels % groups == 0 && out_channels % groups == 0, "Conv2d: in_channels (", in_channels,
             ") and out_channels (", out_channels, ") must both be divisible by groups (", groups, ")");
  WEFT_CHECK(kernel_size.h > 0 && kernel_size.w > 0, "Conv2d: kernel_size must be positive, got ", kernel_size.str());
  WEFT_CHECK(stride.h > 0 && stride.w > 0, "Conv2d: stride must be positive, got ", stride.str());
  WEFT_CHECK(padding.h >= 0 && padding.w >= 0, "Conv2d: padding must be non-negative, got ", padding.str());
  WEFT_CHECK(dilation.h > 0 && dilation.w > 0, "Conv2d: dilation must be positive, got ", dilation.str());
  WEFT_CHECK(is_floating(options.dtype), "Conv2d: parameters need a floating dtype, got ", options.dtype);
  const TensorOptions opts(options.dtype, options.device);
  const Tensor& weight =
      register_parameter("weight", empty({out_channels, in_channels / groups, kernel_size.h, kernel_size.w}, opts));
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyRelu, gen);
  if (bias) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(register_parameter("bias", empty({out_channels}, opts)), -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  return conv2d(input, param("weight"), has_param("bias") ? param("bias") : Tensor(), stride_.array(),
                padding_.array(), dilation_.array(), groups_);
}

std::string Conv2d::extra_repr() const {
  // PyTorch's order, leaving out arguments at their defaults (but stride, always shown).
  std::ostringstream out;
  out << in_channels_ << ", " << out_channels_ << ", kernel_size=" << kernel_size_.str()
      << ", stride=" << stride_.str();
  if (padding_ != Int2(0)) out << ", padding=" << padding_.str();
  if (dilation_ != Int2(1)) out << ", dilation=" << dilation_.str();
  if (groups_ != 1) out << ", groups=" << groups_;
  if (!has_param("bias")) out << ", bias=false";
  return out.str();
}

}  // namespace weft::nn
