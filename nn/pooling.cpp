// Pooling layers: configuration checks at construction; the ops check the input.
#include "nn/pooling.h"

#include "kernels/pooling.h"

namespace weft::nn {

namespace {

const char* bool_str(bool b) { return b ? "true" : "false"; }

void check_window(const char* layer, Int2 kernel_size, Int2 stride, Int2 padding) {
  WEFT_CHECK(kernel_size.h > 0 && kernel_size.w > 0, layer, ": kernel_size must be positive, got ",
             kernel_size.str());
  WEFT_CHECK(stride.h > 0 && stride.w > 0, layer, ": stride must be positive, got ", stride.str());
  WEFT_CHECK(padding.h >= 0 && padding.w >= 0 && 2 * padding.h <= kernel_size.h && 2 * padding.w <= kernel_size.w,
             layer, ": padding must be non-negative and at most half of kernel_size, got padding ", padding.str(),
             " for kernel_size ", kernel_size.str());
}

}  // namespace

MaxPool2d::MaxPool2d(Int2 kernel_size, std::optional<Int2> stride, Int2 padding, Int2 dilation, bool ceil_mode)
    : Cloneable("MaxPool2d"),
      kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      dilation_(dilation),
      ceil_mode_(ceil_mode) {
  check_window("MaxPool2d", kernel_size_, stride_, padding_);
  WEFT_CHECK(dilation.h > 0 && dilation.w > 0, "MaxPool2d: dilation must be positive, got ", dilation.str());
}

Tensor MaxPool2d::forward(const Tensor& input) {
  return max_pool2d(input, kernel_size_.array(), stride_.array(), padding_.array(), dilation_.array(), ceil_mode_);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size_.short_str() + ", stride=" + stride_.short_str() +
         ", padding=" + padding_.short_str() + ", dilation=" + dilation_.short_str() +
         ", ceil_mode=" + bool_str(ceil_mode_);
}

AvgPool2d::AvgPool2d(Int2 kernel_size, std::optional<Int2> stride, Int2 padding, bool ceil_mode,
                     bool count_include_pad)
    : Cloneable("AvgPool2d"),
      kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      ceil_mode_(ceil_mode),
      count_include_pad_(count_include_pad) {
  check_window("AvgPool2d", kernel_size_, stride_, padding_);
}

Tensor AvgPool2d::forward(const Tensor& input) {
  return avg_pool2d(input, kernel_size_.array(), stride_.array(), padding_.array(), ceil_mode_, count_include_pad_);
}

std::string AvgPool2d::extra_repr() const {
  // PyTorch prints only these three.
  return "kernel_size=" + kernel_size_.short_str() + ", stride=" + stride_.short_str() +
         ", padding=" + padding_.short_str();
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Int2 output_size) : Cloneable("AdaptiveAvgPool2d"), output_size_(output_size) {
  WEFT_CHECK(output_size.h > 0 && output_size.w > 0, "AdaptiveAvgPool2d: output_size must be positive, got ",
             output_size.str());
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return adaptive_avg_pool2d(input, output_size_.array()); }

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + output_size_.short_str(); }

}  // namespace weft::nn
