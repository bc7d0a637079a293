// The per-row and per-element formulas of layer normalisation (contract in
// kernels/layer_norm_kernels.h): rstd from a row's sum of squares, the forward's
// y = (x - mean) * rstd * weight + bias, and the backward's xhat and grad_x.
//
// Shared by kernels/cpu/layer_norm.cpp and kernels/cuda/layer_norm.cu. The two backends
// add a row's values in different orders, so their float64 sums differ in the last bits;
// everything after the sums is written here once, so that the same sums give the same
// results. Products that feed sums go through hd::mul_add (Note [Fused multiply-add in
// shared formulas]).
#pragma once

#include "core/host_device.h"
#include "kernels/host_device_math.h"

namespace weft {

// 1 / sqrt(var + eps) from sum_sq = sum (x - mean)^2 over the row's n values (the biased
// variance, as PyTorch's). Two passes (the mean first, then the squares about it) keep the
// variance accurate when the mean dwarfs the spread; a constant row with eps = 0 gives inf,
// and then NaN outputs, as in PyTorch.
WEFT_HOST_DEVICE inline double layer_norm_rstd(double sum_sq, double n, double eps) {
  return 1.0 / hd::sqrt(sum_sq / n + eps);
}

// Forward, per element, in x's precision with the row's mean and rstd rounded to T once
// (what the backward reads back), weight 1 and bias 0 when absent.
template <class T>
WEFT_HOST_DEVICE inline T layer_norm_apply(T x, T mean, T rstd, T weight, T bias) {
  return hd::mul_add((x - mean) * rstd, weight, bias);
}

// Backward, in float64: the normalised input, and grad_x from the row's two sums.
WEFT_HOST_DEVICE inline double layer_norm_xhat(double x, double mean, double rstd) { return (x - mean) * rstd; }

struct LayerNormInputGrad {
  double rstd;
  double mean_dy;       // sum dy / n, dy = grad_y * weight
  double mean_dy_xhat;  // sum dy * xhat / n

  WEFT_HOST_DEVICE LayerNormInputGrad(double rstd_, double sum_dy, double sum_dy_xhat, double n)
      : rstd(rstd_), mean_dy(sum_dy / n), mean_dy_xhat(sum_dy_xhat / n) {}
  // One element's grad_x.
  WEFT_HOST_DEVICE double operator()(double dy, double xhat) const {
    return rstd * (dy - hd::mul_add(xhat, mean_dy_xhat, mean_dy));
  }
};

}  // namespace weft
