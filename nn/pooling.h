// Pooling layers: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d (torch.nn's names, arguments and
// defaults); no parameters, forward is the functional op of kernels/pooling.h.
#pragma once

#include <optional>

#include "nn/conv.h"
#include "nn/module.h"

namespace weft::nn {

// stride defaults to kernel_size, as in PyTorch (stride=None).
class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                     Int2 dilation = 1, bool ceil_mode = false);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  Int2 kernel_size_;
  Int2 stride_;
  Int2 padding_;
  Int2 dilation_;
  bool ceil_mode_;
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  Int2 kernel_size_;
  Int2 stride_;
  Int2 padding_;
  bool ceil_mode_;
  bool count_include_pad_;
};

class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(Int2 output_size);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  Int2 output_size_;
};

}  // namespace weft::nn
