// 2-d pooling: max (with indices), average and adaptive average, with PyTorch's F.*
// names, argument order and semantics.
//
// Inputs are [N, C, H, W] or [C, H, W] (float32 or float64, any strides); every (n, c)
// plane is pooled on its own. Window pairs are {height, width}. Where PyTorch takes
// stride=None, weft takes stride {} (both zero), which means "equal to kernel_size".
// Output size per dim (PyTorch's rule):
//   out = floor_or_ceil((in + 2*pad - dilation*(k-1) - 1) / stride) + 1,
// and with ceil_mode a last window that would start in the right padding is dropped.
// Padding is never selected by max pooling (it acts as -inf) and must be at most half
// the kernel, as in PyTorch.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace weft {

// Max over each window. NaN wins (it propagates), and among equal values the first in
// row-major window order is taken, as on PyTorch's CPU.
Tensor max_pool2d(const Tensor& input, std::array<int64_t, 2> kernel_size, std::array<int64_t, 2> stride = {},
                  std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1},
                  bool ceil_mode = false);
// (output, indices): indices are int64 positions h * W + w inside each input plane.
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, std::array<int64_t, 2> kernel_size,
                                                  std::array<int64_t, 2> stride = {},
                                                  std::array<int64_t, 2> padding = {0, 0},
                                                  std::array<int64_t, 2> dilation = {1, 1}, bool ceil_mode = false);

// Mean over each window. count_include_pad divides by the window clipped to the padded
// input; otherwise by the number of input elements it covers.
Tensor avg_pool2d(const Tensor& input, std::array<int64_t, 2> kernel_size, std::array<int64_t, 2> stride = {},
                  std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);

// Output cell (i, j) averages rows [floor(i*H/oh), ceil((i+1)*H/oh)) and the same for
// columns, so windows may overlap when the sizes do not divide.
Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);

}  // namespace weft
