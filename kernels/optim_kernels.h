// Multi-tensor kernels of the optimizers (nn/optim/) and of gradient clipping.
//
// Each kernel takes whole lists of tensors, so that one optimizer step is one kernel
// call over every parameter: on the CPU one parallel loop over the concatenated index
// space of all tensors (many small tensors share threads, a big one is split); on CUDA
// one launch whose blocks walk a table of (tensor, chunk) pairs, as PyTorch's
// multi_tensor_apply does. Per-tensor values (Adam's step counts, SGD's "buffer is new"
// flags) therefore travel as host vectors next to the tensor lists.
//
// Arguments arrive checked: every tensor is contiguous, all share one floating dtype
// and one device, and the i-th tensor of every list has the i-th parameter's shape.
// Kernels update in place, compute in the tensors' dtype (as PyTorch's single-tensor
// path does) and never throw for user errors.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

using TensorList = std::vector<Tensor>;

// torch.optim.SGD's rule, per element (g = grad, p = param, b = momentum buffer):
//   g = maximize ? -g : g;  g += weight_decay * p;
//   b = new_buffer ? g : momentum * b + (1 - dampening) * g;   (only when momentum != 0)
//   g = nesterov ? g + momentum * b : b;                        (only when momentum != 0)
//   p -= lr * g
struct SgdHyper {
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

// torch.optim.Adam's rule (AdamW: decoupled_weight_decay), per element, t = step count
// of that tensor, already incremented for this step:
//   g = maximize ? -g : g;
//   decoupled ? p *= 1 - lr * weight_decay : g += weight_decay * p;
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g;
//   v_hat = amsgrad ? (v_max = max(v_max, v)) : v;
//   p -= lr / (1 - beta1^t) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
struct AdamHyper {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled_weight_decay = false;
};

// momentum_buffers is empty when momentum == 0; new_buffer[i] != 0 makes buffer i start
// from this step's gradient (PyTorch's "buf = clone(grad)").
using SgdStepFn = void(const TensorList& params, const TensorList& grads, const TensorList& momentum_buffers,
                       const std::vector<uint8_t>& new_buffer, const SgdHyper& hyper);
// max_exp_avg_sqs is empty unless amsgrad; steps[i] >= 1.
using AdamStepFn = void(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                        const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs,
                        const std::vector<int64_t>& steps, const AdamHyper& hyper);
// Gradient clipping keeps its numbers where the gradients are: the norm is written to a
// tensor on their device and the scale kernel reads it there, so clip_grad_norm_ makes no
// host synchronisation on a GPU (the host would otherwise wait for the whole backward
// pass before queueing the optimizer step).
//
// Over every element x of every tensor: sum |x|^norm_type in float64, or max |x| when
// norm_type is +inf (NaN propagates), stored in out, a one-element float64 tensor on the
// tensors' device. Deterministic: the summation order does not depend on the number of
// threads. norm_type > 0.
using NormPowerSumFn = void(const TensorList& tensors, double norm_type, const Tensor& out);
// With coef = clip_coefficient(total_norm, max_norm) (kernels/optim_updates.h): every
// element *= coef when coef < 1, else nothing changes. total_norm is a one-element
// float64 tensor on the tensors' device, read by the kernel.
using ClipScaleFn = void(const TensorList& tensors, const Tensor& total_norm, double max_norm);

extern DispatchStub<SgdStepFn> sgd_step_stub;
extern DispatchStub<AdamStepFn> adam_step_stub;
extern DispatchStub<NormPowerSumFn> norm_power_sum_stub;
extern DispatchStub<ClipScaleFn> clip_scale_stub;

}  // namespace weft
