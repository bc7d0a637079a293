// Kernel signatures of layer normalisation, shared by the CPU and CUDA backends.
//
// Arguments arrive checked: x (and grad_y) is contiguous [rows, n] with rows >= 1 and
// n >= 1 (kernels/layer_norm.cpp reshapes the leading dims into rows and normalized_shape
// into n, and handles empty tensors itself); weight and bias are contiguous [n] of x's
// dtype, or undefined (meaning 1 and 0); mean and rstd are contiguous [rows] of x's dtype.
// Every tensor is on x's device. Outputs are contiguous; an undefined output is one that
// nobody needs and is skipped.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// Per row r: mean[r] = sum x / n and rstd[r] = 1 / sqrt(sum (x - mean)^2 / n + eps), both
// summed in float64 and rounded to x's dtype once; then
// y = (x - mean[r]) * rstd[r] * weight + bias with the rounded values (kernels/layer_norm_math.h).
using LayerNormForwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                const Tensor& y, const Tensor& mean, const Tensor& rstd);

// With xhat = (x - mean[r]) * rstd[r] and dy = grad_y * weight, per row r (sums along the row):
//   grad_x      = rstd[r] * (dy - sum dy / n - xhat * sum(dy * xhat) / n)
// and per column j (sums over the rows):
//   grad_weight = sum grad_y * xhat,  grad_bias = sum grad_y.
// Sums are float64 and the column sums run in a fixed order that depends only on the
// shape (row blocks, then the blocks in order): no atomics, the same bits for any thread
// count and on every run.
using LayerNormBackwardFn = void(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                                 const Tensor& grad_bias);

extern DispatchStub<LayerNormForwardFn> layer_norm_forward_stub;
extern DispatchStub<LayerNormBackwardFn> layer_norm_backward_stub;

}  // namespace weft
