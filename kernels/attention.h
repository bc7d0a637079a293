// scaled_dot_product_attention, as torch.nn.functional.scaled_dot_product_attention:
//
//   out = dropout(softmax(q k^T * scale + mask), dropout_p) v
//
// query [..., L, E], key [..., S, E], value [..., S, Ev] -> out [..., L, Ev], ranks >= 2. The
// leading (batch, head) dims must be equal across the three (weft does not broadcast them).
// scale defaults to 1 / sqrt(E) and must be finite; E >= 1. is_causal masks key j for query i
// when j > i (the lower triangle of an L x S matrix aligned at the top left, as PyTorch's; key
// 0 is never masked, so no row is empty; L > S is allowed, its last rows see every key). No
// key at all (S = 0) gives zeros. float32 or float64, all on one device, differentiable in q,
// k and v (once: the fused backward is not itself differentiable).
//
// Two paths compute it:
//   fused      the default: kernels that walk the keys in tiles with an online softmax and
//              never hold the L x S scores in memory (FlashAttention), forward and backward,
//              on the CPU and on CUDA (kernels/cpu/attention.cpp, kernels/cuda/attention.cu).
//              q, k and v are read as contiguous [B*H, L, E] (a view in that layout is used in
//              place; a GPT block's transposed head views are copied). It saves the output and
//              each row's log-sum-exp of the scaled scores (float32 for float32 inputs, float64
//              for float64) for the backward, which recomputes the probabilities tile by tile.
//              Deterministic: every sum is taken in a fixed order and the backward writes each
//              gradient element from one thread (no atomics), so results repeat bit for bit
//              on any thread count.
//   reference  scaled_dot_product_attention_math: matmul, the mask (where with -inf), softmax,
//              dropout and matmul as separate ops, differentiated by autograd. Exact in float64
//              up to the rounding of its few ops; what the fused path is tested against.
// dropout_p must be in [0, 1). There is no training flag (as in torch's functional form):
// dropout_p > 0 always drops, so pass 0 in evaluation. With dropout_p > 0 the fused entry
// point runs the reference path (the masks come from `gen`, or the default generator of q's
// device, through weft::dropout), so both entry points then give the same result.
#pragma once

#include <optional>

#include "core/generator.h"
#include "core/tensor.h"

namespace weft {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    bool is_causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = std::nullopt, Generator* gen = nullptr);

Tensor scaled_dot_product_attention_math(const Tensor& query, const Tensor& key, const Tensor& value,
                                         bool is_causal = false, double dropout_p = 0.0,
                                         std::optional<double> scale = std::nullopt, Generator* gen = nullptr);

}  // namespace weft
