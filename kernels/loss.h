// Loss functions with PyTorch's semantics: nll_loss, cross_entropy, mse_loss.
//
// cross_entropy is the training loss of weft-train, so it is one fused kernel (log-softmax
// and the weighted pick of the target class in one pass over the logits, keeping only the
// per-position log-sum-exp) with a fused backward (softmax minus the smoothed one-hot,
// scaled). Differences from PyTorch: targets are class indices only (no class-probability
// targets); a class weight is never differentiable, and one that requires grad is refused
// instead of failing later in backward; mse_loss refuses shapes that differ, where
// PyTorch warns and broadcasts.
#pragma once

#include "core/tensor.h"

namespace weft {

// How per-element losses combine: kept as they are, averaged, or summed.
enum class Reduction { None, Mean, Sum };

// Negative log-likelihood of class indices. log_probs is [N, C] or [N, C, d1, ...] (or [C]
// with a 0-d target); target is int64 [N] or [N, d1, ...] with values in [0, C) or equal
// to ignore_index. Per position: -weight[t] * log_probs[n, t, ...] (0 where ignored).
// Mean divides the sum by the sum of weight[t] over the positions not ignored (the count
// of them without a weight), so an all-ignored batch gives NaN, as in PyTorch. weight,
// when defined, is a [C] tensor of log_probs' dtype. Differentiable in log_probs.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean,
                int64_t ignore_index = -100, const Tensor& weight = Tensor());

// nll_loss(log_softmax(logits, 1), target, ...) fused, with PyTorch's label smoothing: the
// target distribution is (1 - label_smoothing) on the target class plus
// label_smoothing / C on every class, each class term scaled by its weight; Mean divides
// by the same weight sum as nll_loss. Differentiable in logits.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     int64_t ignore_index = -100, const Tensor& weight = Tensor(), double label_smoothing = 0.0);

// (input - target)^2, reduced. input and target share shape and dtype (floating).
// Differentiable in both.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace weft
