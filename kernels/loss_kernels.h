// Kernel signatures of the loss family, shared by the CPU and CUDA backends.
//
// Class losses read their input as contiguous [N, C, post] (post: the product of the dims
// after the class dim, 1 for [N, C]) and the target as contiguous int64 [N * post]; the
// loss of position i = n * post + p is computed from the C values at stride post. weight
// is an undefined tensor or a contiguous [C] tensor of the input's dtype. A target that is
// neither in [0, C) nor ignore_index is not an error inside the kernel: the forward
// kernels return the flat position of the first one (or -1), and the Tensor-level op
// raises the error. The CUDA kernels instead record it on the device and return -1; the
// error is raised at the next synchronisation (Note [Device-side errors],
// kernels/cuda/device_error_record.h), so that a loss costs no host synchronisation.
// Backward kernels run on targets that forward has checked (or recorded).
//
// A `grad` argument holds one value per position, or one value (numel 1) for all of them
// (a reduced loss: the Tensor-level op has already divided it by the Mean denominator).
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"
#include "kernels/loss.h"

namespace weft {

// loss[i] = -w[t] * log_probs[n, t, p]; target_weight[i] = w[t] (both 0 where ignored).
// target_weight may be undefined (not needed).
using NllLossFn = int64_t(const Tensor& log_probs, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                          int64_t post, int64_t ignore_index, const Tensor& loss, const Tensor& target_weight);
// grad_log_probs (every element written) = -w[t] * grad[i] at class t, 0 elsewhere.
using NllLossBackwardFn = void(const Tensor& grad, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                               int64_t post, int64_t ignore_index, const Tensor& grad_log_probs);

// With q_c = (1 - ls) * w[t] * [c == t] + (ls / C) * w[c]: loss[i] = sum_c q_c * (lse - x_c),
// where lse = log sum_c exp(x_c) is written to `lse` (float64, [N * post]) for backward.
// target_weight as for NllLossFn.
using CrossEntropyFn = int64_t(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                               int64_t post, int64_t ignore_index, double label_smoothing, const Tensor& loss,
                               const Tensor& target_weight, const Tensor& lse);
// grad_logits[c] = grad[i] * (sum_c' q_c' * softmax_c - q_c), 0 where ignored.
using CrossEntropyBackwardFn = void(const Tensor& grad, const Tensor& logits, const Tensor& target,
                                    const Tensor& weight, const Tensor& lse, int64_t n, int64_t c, int64_t post,
                                    int64_t ignore_index, double label_smoothing, const Tensor& grad_logits);

// input, target contiguous with one shape. out: the elementwise (input - target)^2 for
// None, else one element with their sum (Sum) or mean (Mean), summed deterministically.
using MseLossFn = void(const Tensor& input, const Tensor& target, Reduction reduction, const Tensor& out);
// grad_input = 2 * scale * (input - target) * grad; grad_target = -grad_input. Either
// output may be undefined (not needed).
using MseLossBackwardFn = void(const Tensor& grad, const Tensor& input, const Tensor& target, double scale,
                               const Tensor& grad_input, const Tensor& grad_target);

extern DispatchStub<NllLossFn> nll_loss_stub;
extern DispatchStub<NllLossBackwardFn> nll_loss_backward_stub;
extern DispatchStub<CrossEntropyFn> cross_entropy_stub;
extern DispatchStub<CrossEntropyBackwardFn> cross_entropy_backward_stub;
extern DispatchStub<MseLossFn> mse_loss_stub;
extern DispatchStub<MseLossBackwardFn> mse_loss_backward_stub;

}  // namespace weft
