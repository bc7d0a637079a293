// Indexing with int64 index tensors: index_select, gather, scatter_add, one_hot, embedding.
//
// PyTorch's names, argument order and semantics. Every index is checked against its
// valid range before any kernel writes; the error names the bad value, its position in
// the index tensor and the range. Negative indices are out of range (as in PyTorch's
// index_select / gather / embedding, which do not wrap them). The backward of
// index_select, gather and embedding scatter-adds the gradient into zeros of the input's
// shape; repeated indices accumulate, in index order, the same way for any thread count.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace weft {

// out = x with dim `dim` replaced by index's entries: out.select(dim, k) ==
// x.select(dim, index[k]). index: int64, 0-d or 1-d.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

// torch.gather: out has index's shape and out[i][j][k] = x[i][index[i][j][k]][k] (for
// dim 1). index: int64 with x's rank and index.size(d) <= x.size(d) for every d != dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

// torch.scatter_add, out of place: out = x.clone(), then for every position p of index
// out[p with dim replaced by index[p]] += src[p]. index: int64 with x's rank,
// index.size(d) <= src.size(d) for every d, index.size(d) <= x.size(d) for d != dim.
// Differentiable in x and src.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

// F.one_hot: int64 result of shape [..., num_classes]; num_classes = -1 means
// max(index) + 1. Not differentiable.
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);

// F.embedding in ATen's argument order (torch.embedding(weight, indices)): weight [V, D],
// indices int64 of any shape -> [..., D]. The row padding_idx (negative counts from the
// end, as in F.embedding) receives no gradient; its forward values are left as they are.
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace weft
