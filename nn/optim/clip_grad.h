// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace weft::optim {

// Scales the gradients of `params` in place so that their global norm (the norm of the
// concatenation of every gradient) is at most max_norm, and returns that norm before
// clipping. PyTorch's formula: clip_coef = max_norm / (total_norm + 1e-6), applied
// only when it is < 1. norm_type > 0, or INFINITY for the largest |g|. Parameters whose
// grad is undefined are ignored; with none, the norm is 0. A NaN norm leaves the
// gradients as they are; with error_if_nonfinite, a NaN or infinite norm is an error
// (and nothing is scaled).
//
// Differences from PyTorch: the norm is returned as a double and accumulated in float64
// (PyTorch accumulates in the gradients' dtype); a negative max_norm is an error.
// Gradients on several devices (and dtypes) are allowed: the norm is global over all of
// them, combined from per-(device, dtype) partial sums in a fixed order (deterministic;
// equal to the one-device norm up to float64 rounding), and each device's gradients are
// scaled on that device.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace weft::optim
