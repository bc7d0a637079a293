// Kernel signatures of the fused attention (kernels/attention.h), shared by the CPU and CUDA
// backends.
//
// Every tensor arrives contiguous, on one device, with the batch and head dims flattened
// into one of size BH >= 1:
//   q [BH, L, E]   k [BH, S, E]   v [BH, S, Ev]   out, grad_out [BH, L, Ev]
//   lse, delta [BH, L]
// with L, S, E, Ev >= 1 (the op handles empty shapes itself). q, k, v, out and the
// gradients share one dtype, float32 or float64; lse and delta have that dtype too.
// Scores are x_ij = scale * (q_i . k_j); with is_causal, key j is masked for query i when
// j > i (top-left aligned, so key 0 is never masked and no row is empty).
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// out_i = sum_j P_ij v_j with P_ij = exp(x_ij - lse_i), lse_i = log sum_j exp(x_ij) over the
// unmasked keys. Both written completely. The L x S matrix P is never stored.
using AttentionForwardFn = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                const Tensor& lse, double scale, bool is_causal);

// With P recomputed from q, k and lse, dO = grad_out and D_i = sum_c dO_ic out_ic (written to
// delta, scratch the kernel fills first):
//   grad_v = P^T dO,  dS = P * (dO v^T - D),  grad_q = scale * dS k,  grad_k = scale * dS^T q.
// grad_q, grad_k and grad_v are written completely, each element by one thread in an order
// fixed by the shapes (no atomics): the result repeats bit for bit on any thread count.
using AttentionBackwardFn = void(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const Tensor& delta, const Tensor& grad_q,
                                 const Tensor& grad_k, const Tensor& grad_v, double scale, bool is_causal);

extern DispatchStub<AttentionForwardFn> attention_forward_stub;
extern DispatchStub<AttentionBackwardFn> attention_backward_stub;

}  // namespace weft
