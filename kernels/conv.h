// 2-d convolution: F.conv2d's arguments, defaults and output size.
//
// input [N, C, H, W] (or unbatched [C, H, W]), weight [O, C / groups, kH, kW], bias [O]
// or undefined; zero padding on both sides of each spatial dim. Output size per spatial
// dim: (in + 2 * padding - dilation * (k - 1) - 1) / stride + 1. Like PyTorch this is a
// cross-correlation (the kernel is not flipped). float32 or float64, one dtype and one
// device for all tensors. The backward is one node that computes only the gradients
// that are needed.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace weft {

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

}  // namespace weft
