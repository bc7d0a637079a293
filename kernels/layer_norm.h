// layer_norm over the trailing dims, as torch.nn.functional.layer_norm.
//
// x [..., *normalized_shape]: each of the outer rows (the product of the leading dims) is
// normalised on its own, y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased
// variance (divided by the row length), as PyTorch's. weight and bias are optional (both
// or either undefined), shaped normalized_shape, on x's device in x's dtype; eps >= 0. Mean
// and variance are accumulated in float64 on both devices (wider than PyTorch's float32 for
// float32 input), in two passes (the mean, then the squares about it) and in a fixed order
// per row, so the result does not depend on the thread count. Differentiable in x, weight
// and bias; the backward reuses the saved per-row mean and 1 / std (rounded to x's dtype, as
// the forward used them), and sums grad_weight and grad_bias over the rows in an order
// fixed by the shape: the same bits on every run, for any thread count, without atomics.
#pragma once

#include "core/shape.h"
#include "core/tensor.h"

namespace weft {

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace weft
