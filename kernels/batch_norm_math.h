// The per-channel and per-element formulas of batch normalisation (contract in
// kernels/batch_norm_kernels.h): statistics from a channel's sums, the running-statistics
// update, the forward's y = (x - mean) * scale + bias, and backward's coefficients and
// grad_input.
//
// Shared by kernels/cpu/batch_norm.cpp and kernels/cuda/batch_norm_kernels.cu. The two
// backends add a channel's values in different orders, so their sums differ in the last
// bits; everything after the sums is written here once, so that the same sums give the
// same results, and the devices differ only as much as their sums do. Products that feed
// sums go through hd::mul_add (Note [Fused multiply-add in shared formulas]).
#pragma once

#include "core/host_device.h"
#include "kernels/host_device_math.h"

namespace weft {

// A channel's mean and biased variance from sum_d = sum (x - shift) and sum_d2 = sum
// (x - shift)^2 over its count values, shift being one of them (its first): shifted sums
// keep the variance accurate when the mean is large next to the spread.
struct BatchNormMoments {
  double mean, var;
};

WEFT_HOST_DEVICE inline BatchNormMoments batch_norm_moments(double shift, double sum_d, double sum_d2, double count) {
  const double var = (sum_d2 - sum_d * sum_d / count) / count;
  return {shift + sum_d / count, var > 0 ? var : 0.0};  // rounding can push it below 0; NaN gives 0 too
}

// The running statistics after one training step (var is the biased batch variance; the
// running variance takes the unbiased one). count > 1.
WEFT_HOST_DEVICE inline double batch_norm_running_mean(double running, double mean, double momentum) {
  return hd::mul_add(1 - momentum, running, momentum * mean);
}
WEFT_HOST_DEVICE inline double batch_norm_running_var(double running, double var, double count, double momentum) {
  return hd::mul_add(1 - momentum, running, momentum * var * count / (count - 1));
}

// Forward: y = (x - centre) * scale + shift per element, with centre = mean,
// scale = weight / sqrt(var + eps) and shift = bias, each rounded to T once per channel.
// Subtracting the mean first (rather than folding it into the shift) keeps float32
// accurate when the mean dwarfs the spread.
WEFT_HOST_DEVICE inline double batch_norm_scale(double weight, double var, double eps) {
  return weight / hd::sqrt(var + eps);
}
template <class T>
WEFT_HOST_DEVICE inline T batch_norm_normalize(T x, T centre, T scale, T shift) {
  return hd::mul_add(x - centre, scale, shift);
}

// Backward, per channel, from sum_g = sum g and sum_gd = sum g * (x - mean) over its count
// values: grad_weight = sum g * xhat (grad_bias is sum_g itself), and grad_input
// = a * g + bx * (x - mean) + k per element, the training terms (mean and var being
// functions of the input) folded into bx and k, which are 0 in evaluation.
struct BatchNormInputGrad {
  double a, bx, k;

  // One element's grad_input, in double; centred = x - mean.
  WEFT_HOST_DEVICE double operator()(double g, double centred) const { return hd::mul_add(a, g, bx * centred) + k; }
};

struct BatchNormBackwardCoefficients {
  double grad_weight;
  BatchNormInputGrad input;
};

WEFT_HOST_DEVICE inline BatchNormBackwardCoefficients batch_norm_backward_coefficients(
    double weight, double var, double eps, double sum_g, double sum_gd, double count, bool training) {
  const double invstd = 1 / hd::sqrt(var + eps);
  const double a = weight * invstd;
  BatchNormBackwardCoefficients c{sum_gd * invstd, {a, 0.0, 0.0}};
  if (training && count > 0) {
    c.input.bx = -a * invstd * invstd * sum_gd / count;
    c.input.k = -a * sum_g / count;
  }
  return c;
}

}  // namespace weft
