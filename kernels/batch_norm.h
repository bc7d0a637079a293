// Batch normalisation with PyTorch's F.batch_norm name, argument order and semantics.
//
// input is [N, C] or [N, C, *] (float32 or float64); each channel c is normalised over
// every dim but dim 1:  y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c.
// weight, bias, running_mean and running_var are [C] tensors of input's dtype and
// device, each optional (an undefined Tensor()); the running stats come as a pair.
//
// training = true: mean and var are the batch's (biased variance), and the running stats,
// when given, are updated in place as PyTorch does, with the *unbiased* batch variance:
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)
// They are buffers: the update is not recorded by autograd, and they never get a
// gradient. training = false: the running stats (then required) are used as they are.
//
// Gradients flow to input, weight and bias in both modes (in training, through the
// batch mean and variance too); the backward is one fused kernel.
#pragma once

#include "core/tensor.h"

namespace weft {

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  double momentum = 0.1, double eps = 1e-5);

}  // namespace weft
