// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace weft::optim {

// Scales the gradients of `params` in place so that their global norm (the norm of the
// concatenation of every gradient) is at most max_norm, and returns that norm before
// clipping, as a 0-d float64 tensor on the device of the first gradient (read it with
// item()); the norm and the clipping factor stay on the devices, so on a GPU the host
// does not wait for the backward pass to finish. PyTorch's formula: the gradients are
// multiplied by max_norm / (total_norm + 1e-6) clamped to 1, so a NaN norm makes them NaN and
// an infinite one multiplies them by 0. norm_type > 0, or INFINITY for the largest |g|.
// Parameters whose grad is undefined are ignored; with none, the norm is a CPU 0. With
// error_if_nonfinite, a NaN or infinite norm is an error (and nothing is scaled); that check
// reads the norm on the host, so with error_if_nonfinite the call waits for the GPU (as in
// PyTorch).
//
// Differences from PyTorch: the norm is a float64 tensor, accumulated in float64 (PyTorch
// accumulates in the gradients' dtype and returns that dtype); a negative max_norm is an
// error.
// Gradients on several devices (and dtypes) are allowed: the norm is global over all of
// them, combined from per-(device, dtype) partial sums in a fixed order (deterministic;
// equal to the one-device norm up to float64 rounding), and each device's gradients are
// scaled on that device.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace weft::optim
