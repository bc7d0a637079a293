// Joining and splitting tensors: cat, stack, split, chunk (PyTorch's names and semantics).
//
// cat and stack copy into a fresh tensor; their backward hands each input the slice of
// the gradient that it filled. split and chunk return views of the input (narrow), as
// PyTorch does; all the views of one call share one backward node, which joins the
// outputs' gradients with cat (an output nobody used contributes zeros).
//
// Where weft differs from PyTorch: all inputs of cat / stack must share one dtype (no
// promotion) and one device, and cat does not skip the legacy 1-d empty tensor of shape
// [0] that PyTorch lets through beside tensors of any rank.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace weft {

// Joins tensors along an existing dim; every other dim must match.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);

// Joins tensors of one shape along a new dim, inserted at `dim` (in [-(rank+1), rank]).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// Views of consecutive pieces of `split_size` along dim (the last one may be shorter).
// Note: split(x, {4}) picks this overload (a braced single value is an int64_t); spell
// the sizes as std::vector<int64_t>{4} to mean one piece of size 4.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);

// Views of pieces with the given sizes along dim (PyTorch's split_with_sizes); the sizes
// must sum to the dim's size.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);

// Splits into pieces of ceil(size / chunks) along dim: at most `chunks` views, fewer when
// the size does not allow that many non-empty pieces (as in PyTorch).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace weft
