// cat / stack / split / chunk: argument checks, the copies, and each op's backward.
//
// No kernel of their own: cat and stack copy every input into a narrow()/select() view
// of the output with copy_values, which already runs on any device, and split / chunk
// are views. The views are taken from detached tensors so that the forward records one
// node per op, not one per piece.
#include "kernels/shape_ops.h"

#include <numeric>
#include <string>

#include "core/autograd.h"
#include "core/copy.h"
#include "kernels/checks.h"

namespace weft {

namespace {

// Defined, one dtype, one device; names the position at fault. (Any dtype: the ops only
// copy, so float16 and bfloat16 join too.)
void check_joinable(const std::vector<Tensor>& tensors, const char* op) {
  WEFT_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i)
    WEFT_CHECK(tensors[i].defined(), op, ": tensor ", i, " of the list is an undefined tensor");
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    WEFT_CHECK(t.dtype() == first.dtype(), op, ": dtype mismatch, tensor ", i, " is ", t.dtype(), " but tensor 0 is ",
               first.dtype(), " (weft does not promote; convert one with .to(DType))");
    WEFT_CHECK(t.device() == first.device(), op, ": expected all tensors on one device, but tensor ", i, " is on ",
               t.device(), " and tensor 0 on ", first.device(), " (move one with .to(device))");
  }
}

// Records a node whose backward gives input i the piece `piece(g, i)` of the gradient.
template <class Piece>
void record_join(const char* name, const Tensor& out, const std::vector<Tensor>& inputs, Piece piece) {
  if (!any_requires_grad(std::span<const Tensor>(inputs))) return;
  std::vector<bool> needs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) needs[i] = inputs[i].requires_grad();
  set_history(out, make_node(
                       name,
                       [needs, piece](const GradList& g) -> GradList {
                         GradList grads(needs.size());
                         for (size_t i = 0; i < needs.size(); ++i)
                           if (needs[i]) grads[i] = piece(g[0], i);
                         return grads;
                       },
                       std::span<const Tensor>(inputs)));
}

std::string list_str(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// Views of x of the given sizes along dim; one backward node for all of them.
std::vector<Tensor> split_views(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  {
    NoGradGuard no_grad;  // narrow must not record: the pieces get one shared node below
    int64_t start = 0;
    for (int64_t size : sizes) {
      pieces.push_back(x.narrow(dim, start, size));
      start += size;
    }
  }
  if (any_requires_grad(x)) {
    auto node = make_node(
        "SplitBackward", [dim](const GradList& g) -> GradList { return {cat(g, dim)}; }, x);
    for (const Tensor& piece : pieces) set_history(piece, node);
  }
  return pieces;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  check_joinable(tensors, "cat");
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i)
    WEFT_CHECK(tensors[i].dim() > 0, "cat: tensor ", i, " is zero-dimensional and cannot be concatenated (use stack, "
               "or unsqueeze it first)");
  const int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    WEFT_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " has shape ", t.shape(), " but tensor 0 has shape ",
               first.shape(), "; all tensors need the same number of dimensions");
    for (int64_t k = 0; k < first.dim(); ++k)
      WEFT_CHECK(k == d || t.shape()[k] == first.shape()[k], "cat: sizes must match except in dimension ", d,
                 ", but tensor ", i, " has shape ", t.shape(), " and tensor 0 has shape ", first.shape(),
                 " (they differ in dimension ", k, ")");
    shape[d] += t.shape()[d];
  }

  Tensor out = empty(shape, TensorOptions(first.dtype(), first.device()));
  std::vector<int64_t> starts(tensors.size());
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      starts[i] = start;
      const int64_t length = tensors[i].shape()[d];
      if (length > 0) copy_values(out.narrow(d, start, length), tensors[i]);
      start += length;
    }
  }
  std::vector<int64_t> lengths(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) lengths[i] = tensors[i].shape()[d];
  record_join("CatBackward", out, tensors, [d, starts, lengths](const Tensor& g, size_t i) {
    return g.narrow(d, starts[i], lengths[i]);
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_joinable(tensors, "stack");
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i)
    WEFT_CHECK(tensors[i].shape() == first.shape(), "stack: expected all tensors to have the same shape, but tensor ",
               i, " has shape ", tensors[i].shape(), " and tensor 0 has shape ", first.shape());
  const int64_t d = wrap_dim(dim, first.dim() + 1, "stack");
  Shape shape = first.shape();
  shape.insert(d, static_cast<int64_t>(tensors.size()));

  Tensor out = empty(shape, TensorOptions(first.dtype(), first.device()));
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) copy_values(out.select(d, static_cast<int64_t>(i)), tensors[i]);
  }
  record_join("StackBackward", out, tensors,
              [d](const Tensor& g, size_t i) { return g.select(d, static_cast<int64_t>(i)); });
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  check_defined(x, "split", "input");
  WEFT_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.shape()[d];
  WEFT_CHECK(split_size >= 0, "split: split_size must be non-negative, got ", split_size);
  WEFT_CHECK(split_size > 0 || n == 0, "split: split_size can only be 0 if dimension ", d,
             " has size 0, but it has size ", n, " (shape ", x.shape(), ")");
  const int64_t pieces = split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  std::vector<int64_t> sizes(pieces, split_size);
  sizes.back() = n - split_size * (pieces - 1);
  return split_views(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined(x, "split", "input");
  WEFT_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  WEFT_CHECK(!sizes.empty(), "split: expected a non-empty list of split sizes");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  for (size_t i = 0; i < sizes.size(); ++i)
    WEFT_CHECK(sizes[i] >= 0, "split: split sizes must be non-negative, but size ", i, " is ", sizes[i]);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  WEFT_CHECK(total == x.shape()[d], "split: split sizes ", list_str(sizes), " sum to ", total, " but dimension ", d,
             " has size ", x.shape()[d], " (shape ", x.shape(), ")");
  return split_views(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  check_defined(x, "chunk", "input");
  WEFT_CHECK(x.dim() > 0, "chunk: cannot chunk a zero-dimensional tensor");
  WEFT_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.shape()[d];
  // An empty dim still gives `chunks` (empty) pieces, as in PyTorch.
  if (n == 0) return split_views(x, std::vector<int64_t>(chunks, 0), d);
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace weft
