// The per-element update rules of SGD and Adam / AdamW (written out in
// kernels/optim_kernels.h), and the scalars they are built from.
//
// Shared by kernels/cpu/optim.cpp and kernels/cuda/optim.cu: the kernels differ in how
// they walk a list of tensors, not in what one element's step computes, and a fused step
// must give the same parameters and state on either device. Each rule converts its
// hyper-parameters to T once on the host, as PyTorch rounds its scalar arguments, and
// computes in T; every product that feeds a sum goes through hd::mul_add (Note [Fused
// multiply-add in shared formulas]), so that g++ and nvcc round the same way.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "kernels/host_device_math.h"
#include "kernels/optim_kernels.h"

namespace weft {

template <class T>
struct SgdRule {
  T neg_lr, momentum, keep, weight_decay;  // keep = 1 - dampening
  bool use_momentum, use_weight_decay, nesterov, maximize;

  static SgdRule from(const SgdHyper& h) {
    return {T(-h.lr),          T(h.momentum),         T(1 - h.dampening), T(h.weight_decay),
            h.momentum != 0,   h.weight_decay != 0,   h.nesterov,         h.maximize};
  }

  // Element i of a parameter p with gradient g and, when momentum is used, buffer b;
  // `fresh` makes the buffer start from this step's gradient.
  WEFT_HOST_DEVICE void step(T* p, const T* g, T* b, bool fresh, int64_t i) const {
    const T x = p[i];
    T d = maximize ? T(-g[i]) : g[i];
    if (use_weight_decay) d = hd::mul_add(weight_decay, x, d);
    if (use_momentum) {
      const T buf = fresh ? d : hd::mul_add(b[i], momentum, keep * d);
      b[i] = buf;
      d = nesterov ? hd::mul_add(momentum, buf, d) : buf;
    }
    p[i] = hd::mul_add(neg_lr, d, x);
  }
};

// The bias-correction terms of one tensor at step t (>= 1), in double as PyTorch computes
// them (Python floats); a rule rounds them to T.
struct AdamStepScalars {
  double neg_step_size;          // -lr / (1 - beta1^t)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)

  static AdamStepScalars at(const AdamHyper& h, int64_t step) {
    const double t = static_cast<double>(step);
    return {-(h.lr / (1 - std::pow(h.beta1, t))), std::sqrt(1 - std::pow(h.beta2, t))};
  }
};

template <class T>
struct AdamRule {
  T weight1, beta2, weight2, eps, weight_decay, decay;  // weight1 = 1 - beta1, weight2 = 1 - beta2
  bool use_weight_decay, decoupled, amsgrad, maximize;

  static AdamRule from(const AdamHyper& h) {
    return {T(1 - h.beta1),      T(h.beta2),
            T(1 - h.beta2),      T(h.eps),
            T(h.weight_decay),   T(1 - h.lr * h.weight_decay),
            h.weight_decay != 0, h.decoupled_weight_decay,
            h.amsgrad,           h.maximize};
  }

  // PyTorch's lerp: exact at both ends of the weight range.
  WEFT_HOST_DEVICE static T lerp(T start, T end, T weight) {
    return (weight < T(0.5) && weight > T(-0.5)) ? hd::mul_add(weight, end - start, start)
                                                 : hd::mul_add(-(end - start), T(1) - weight, end);
  }

  // Element i of parameter p with gradient g, first and second moments m and v, and
  // v_max when amsgrad; step_term and bc2_sqrt are the tensor's AdamStepScalars in T.
  WEFT_HOST_DEVICE void step(T* p, const T* g, T* m, T* v, T* v_max, int64_t i, T step_term, T bc2_sqrt) const {
    T d = maximize ? T(-g[i]) : g[i];
    T x = p[i];
    if (use_weight_decay) {
      if (decoupled)
        x = x * decay;
      else
        d = hd::mul_add(weight_decay, x, d);
    }
    const T m_new = lerp(m[i], d, weight1);
    const T v_new = hd::mul_add(v[i], beta2, weight2 * d * d);
    m[i] = m_new;
    v[i] = v_new;
    T v_hat = v_new;
    if (amsgrad) {
      // torch.maximum: NaN propagates from either side.
      const T a = v_max[i];
      v_hat = (a != a || a > v_hat) ? a : v_hat;
      v_max[i] = v_hat;
    }
    const T denom = hd::sqrt(v_hat) / bc2_sqrt + eps;
    p[i] = hd::mul_add(step_term, m_new / denom, x);
  }
};

// clip_grad_norm_'s factor, PyTorch's formula: the gradients are multiplied by it clamped
// to 1. A factor >= 1 changes nothing, so the kernels skip that multiply; a NaN norm gives a
// NaN factor, which makes every gradient NaN, as in PyTorch (clamp keeps a NaN).
WEFT_HOST_DEVICE inline double clip_coefficient(double total_norm, double max_norm) {
  return max_norm / (total_norm + 1e-6);
}

}  // namespace weft
