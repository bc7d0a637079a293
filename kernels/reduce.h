// Reductions over any set of dims, with keepdim: sum, mean, amax / amin, var, argmax /
// argmin, and max / min along one dim with their indices.
//
// PyTorch's names and semantics, with these differences: an empty dim list means every
// dim (for every op here), and sum keeps the input's dtype (PyTorch widens integer sums
// to int64; weft never changes a dtype silently). Sums of float32 accumulate in float64
// on the CPU. Every reduction is deterministic: each output element is reduced in one
// fixed order, whatever the number of threads.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace weft {

// Integer and bool inputs sum to int64, as in PyTorch (no wrap-around at the input's width).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Floating dtypes only. The mean over zero elements is NaN, as in PyTorch.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// Largest / smallest value (torch.amax / torch.amin). NaN propagates. The gradient is
// split evenly among the elements that tie for the extremum, as in PyTorch. Reducing a
// dim of size 0 is an error.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// Variance with Bessel-style `correction` (1: unbiased, 0: population), as torch.var:
// sum((x - mean)^2) / max(0, N - correction). Floating dtypes only; differentiable.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

// Index (int64) of the first largest / smallest value along `dim`; with no dim, the index
// into the flattened tensor (keepdim then gives every dim size 1). A NaN counts as the
// largest value for argmax and the smallest for argmin, as in PyTorch. Not differentiable.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = {}, bool keepdim = false);

// torch.max(x, dim) / torch.min(x, dim): {values, indices} along one dim; the index is the
// first extremum. Differentiable in values: the gradient flows to the selected index only
// (unlike amax, which splits it among ties), as in PyTorch.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);

// Sums `x` down to `shape` (the inverse of broadcasting `shape` up to x's shape): the
// gradient of every broadcasting op goes through this.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

}  // namespace weft
