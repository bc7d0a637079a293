// Conv2d (torch.nn.Conv2d) and Int2, the {height, width} pair that the 2-d layers take.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/generator.h"
#include "nn/module.h"

namespace weft::nn {

// A size per spatial dim, {height, width}. Like PyTorch's int-or-tuple arguments (and
// LibTorch's ExpandingArray<2>), one number means the same for both dims: Int2(3) and
// Int2{3, 3} are equal.
struct Int2 {
  int64_t h = 0;
  int64_t w = 0;

  constexpr Int2(int64_t both) : h(both), w(both) {}  // NOLINT: implicit, as in PyTorch
  constexpr Int2(int64_t height, int64_t width) : h(height), w(width) {}
  constexpr Int2(std::array<int64_t, 2> hw) : h(hw[0]), w(hw[1]) {}  // NOLINT

  std::array<int64_t, 2> array() const { return {h, w}; }
  // "(h, w)", as Python prints a tuple.
  std::string str() const;
  // "h" when both are equal, else "(h, w)": how PyTorch prints an argument given as one int.
  std::string short_str() const;
  friend constexpr bool operator==(Int2 a, Int2 b) { return a.h == b.h && a.w == b.w; }
};

// Parameters "weight" [out_channels, in_channels / groups, kH, kW] and, with bias,
// "bias" [out_channels]; zero padding. Initialised as PyTorch's reset_parameters():
// weight by kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
// fan_in = in_channels / groups * kH * kW, and bias from the same range, drawn from `gen`
// (default generator when null).
class Conv2d : public Cloneable<Conv2d> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, Int2 stride = 1, Int2 padding = 0,
         Int2 dilation = 1, int64_t groups = 1, bool bias = true, const TensorOptions& options = {},
         Generator* gen = nullptr);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  Int2 kernel_size() const { return kernel_size_; }
  Int2 stride() const { return stride_; }
  Int2 padding() const { return padding_; }
  Int2 dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }

 private:
  int64_t in_channels_;
  int64_t out_channels_;
  Int2 kernel_size_;
  Int2 stride_;
  Int2 padding_;
  Int2 dilation_;
  int64_t groups_;
};

}  // namespace weft::nn
