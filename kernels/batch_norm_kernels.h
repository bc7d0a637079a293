// Kernel signatures of batch normalisation, shared by the CPU and CUDA backends.
//
// Arguments arrive checked: input (and grad_out) is contiguous [N, C, S], S being the
// product of the dims after C (1 for a 2-d input). Per-channel tensors (mean, var,
// weight, bias, running stats) are 1-d [C] of input's dtype with any stride; weight and
// bias may be undefined (meaning 1 and 0). `var` is always the variance the
// normalisation divides by (biased batch variance, or the running variance in
// evaluation), eps not yet added. Outputs are contiguous; an undefined output is one
// that nobody needs and is skipped.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// Per channel, in one pass over the channel's N * S values (N * S > 1): mean and biased
// var. When running_mean / running_var are defined they are updated in place with
// `momentum` and the unbiased variance.
using BatchNormStatsFn = void(const Tensor& input, const Tensor& mean, const Tensor& var,
                              const Tensor& running_mean, const Tensor& running_var, double momentum);

// out = (input - mean) / sqrt(var + eps) * weight + bias.
using BatchNormForwardFn = void(const Tensor& input, const Tensor& mean, const Tensor& var, double eps,
                                const Tensor& weight, const Tensor& bias, const Tensor& out);

// With xhat = (x - mean) * invstd, invstd = 1 / sqrt(var + eps), and sums over a channel:
//   grad_bias = sum g,  grad_weight = sum g * xhat,
//   grad_input = weight * invstd * (g - sum g / M - xhat * sum(g * xhat) / M)  (training,
//                where mean and var are functions of the input; M = N * S)
//   grad_input = weight * invstd * g                                          (evaluation)
using BatchNormBackwardFn = void(const Tensor& grad_out, const Tensor& input, const Tensor& mean, const Tensor& var,
                                 double eps, const Tensor& weight, bool training, const Tensor& grad_input,
                                 const Tensor& grad_weight, const Tensor& grad_bias);

extern DispatchStub<BatchNormStatsFn> batch_norm_stats_stub;
extern DispatchStub<BatchNormForwardFn> batch_norm_forward_stub;
extern DispatchStub<BatchNormBackwardFn> batch_norm_backward_stub;

}  // namespace weft
