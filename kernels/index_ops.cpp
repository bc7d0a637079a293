// Indexing ops: argument and range checks, dispatch, and each op's backward.
//
// Every index tensor is scanned (index_range_stub) before an output is written, so a bad
// index is reported with its value and position instead of reading or writing outside a
// buffer: at once on the CPU, at the next synchronisation on CUDA, whose kernels skip it
// (Note [Device-side errors], kernels/cuda/device_error_record.h). Kernels get the index
// contiguous; index_select and embedding also get their values contiguous, which is free
// for the usual (contiguous) weight.
#include "kernels/index_ops.h"

#include <limits>
#include <string>

#include "core/autograd.h"
#include "core/copy.h"
#include "kernels/checks.h"
#include "kernels/index_ops_kernels.h"

namespace weft {

constinit DispatchStub<IndexRangeFn> index_range_stub{"index range check"};
constinit DispatchStub<IndexSelectFn> index_select_stub{"index_select"};
constinit DispatchStub<IndexAddFn> index_add_stub{"index_add"};
constinit DispatchStub<GatherFn> gather_stub{"gather"};
constinit DispatchStub<ScatterAddFn> scatter_add_stub{"scatter_add"};

namespace {

void check_index_tensor(const Tensor& index, const Tensor& x, const char* op, const char* arg) {
  check_defined(index, op, arg);
  WEFT_CHECK(index.dtype() == DType::Int64, op, ": '", arg, "' must be an int64 tensor, got ", index.dtype(),
             " (convert it with .to(DType::Int64))");
  if (x.defined())
    WEFT_CHECK(index.device() == x.device(), op, ": expected all tensors on one device, but '", arg, "' is on ",
               index.device(), " and the input on ", x.device(), " (move one with .to(device))");
}

// "[i, j, ...]": the multi-index of flat position `flat` in a row-major tensor of `shape`.
std::string position_str(int64_t flat, const Shape& shape) {
  std::vector<int64_t> coords(shape.size());
  for (int64_t d = shape.size() - 1; d >= 0; --d) {
    coords[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string out = "[";
  for (size_t i = 0; i < coords.size(); ++i) out += (i ? ", " : "") + std::to_string(coords[i]);
  return out + "]";
}

// Scans a contiguous index for entries outside [0, bound); `what` says what the bound
// is ("dimension 1 of size 4"); `op` is a string literal. Returns what the scan found.
IndexRange check_in_range(const Tensor& index, const Shape& index_shape, int64_t bound, const char* op,
                          const std::string& what) {
  if (index.numel() == 0) return {};
  IndexRange range = index_range_stub(index.device(), index, bound, op, false);
  WEFT_CHECK(range.deferred || range.first_bad < 0, op, ": index ", range.bad_value, " at position ",
             position_str(range.first_bad, index_shape), " is out of range for ", what, " (expected 0 <= index < ",
             bound, ")");
  return range;
}

std::string dim_str(int64_t dim, int64_t size) {
  return "dimension " + std::to_string(dim) + " of size " + std::to_string(size);
}


// A 0-d tensor read as [1], so that the kernels only see rank >= 1.
Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.view({1}) : t; }

// index.size(d) <= bound.size(d) for every d (except `skip`, if >= 0).
void check_fits(const Tensor& index, const Tensor& bound, int64_t skip, const char* op, const char* bound_name) {
  for (int64_t d = 0; d < index.dim(); ++d)
    WEFT_CHECK(d == skip || index.shape()[d] <= bound.shape()[d], op, ": index shape ", index.shape(),
               " does not fit ", bound_name, " shape ", bound.shape(), ": index.size(", d, ") = ", index.shape()[d],
               " > ", bound_name, ".size(", d, ") = ", bound.shape()[d]);
}

// The checks that gather and scatter_add share; returns the wrapped dim.
int64_t check_gather_args(const Tensor& x, int64_t dim, const Tensor& index, const char* op) {
  check_defined(x, op, "input");
  check_index_tensor(index, x, op, "index");
  check_supported(x.dtype(), op);
  WEFT_CHECK(index.dim() == x.dim(), op, ": index must have the input's number of dimensions, got index shape ",
             index.shape(), " and input shape ", x.shape());
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_fits(index, x, d, op, "input");
  return d;
}

// out += src scattered along dim at index; no checks (callers made them).
void scatter_add_into(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  if (index.numel() == 0) return;
  scatter_add_stub(out.device(), at_least_1d(out), dim, at_least_1d(index), at_least_1d(src));
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "index_select", "input");
  check_index_tensor(index, x, "index_select", "index");
  check_supported(x.dtype(), "index_select");
  WEFT_CHECK(index.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape ", index.shape());
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  WEFT_CHECK(x.dim() > 0 || index.numel() == 1, "index_select: a 0-d input takes exactly one index, got ",
             index.numel());
  Tensor idx = index.detach().contiguous();
  const DimSplit rows = split_at_dim(x.shape(), d);
  check_in_range(idx, index.shape(), rows.size, "index_select", dim_str(d, rows.size));

  Shape shape = x.shape();
  if (x.dim() > 0) shape[d] = idx.numel();
  Tensor out = empty(shape, TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) index_select_stub(x.device(), x.detach().contiguous(), idx, out, rows.outer, rows.size, rows.inner);

  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         "IndexSelectBackward",
                         [shape = x.shape(), rows, si = SavedTensor(idx)](const GradList& g) -> GradList {
                           Tensor grad = zeros(shape, TensorOptions(g[0].dtype(), g[0].device()));
                           if (g[0].numel() > 0)
                             index_add_stub(grad.device(), g[0].contiguous(), si.unpack(), grad, rows.outer, rows.size,
                                            rows.inner, -1);
                           return {grad};
                         },
                         x));
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t d = check_gather_args(x, dim, index, "gather");
  const int64_t n = x.dim() == 0 ? 1 : x.shape()[d];
  Tensor idx = index.detach().contiguous();
  check_in_range(idx, index.shape(), n, "gather", dim_str(d, n));

  Tensor out = empty(index.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) gather_stub(x.device(), at_least_1d(x.detach()), d, at_least_1d(idx), at_least_1d(out));

  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         "GatherBackward",
                         [shape = x.shape(), d, si = SavedTensor(idx)](const GradList& g) -> GradList {
                           Tensor grad = zeros(shape, TensorOptions(g[0].dtype(), g[0].device()));
                           scatter_add_into(grad, d, si.unpack(), g[0]);
                           return {grad};
                         },
                         x));
  }
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t d = check_gather_args(x, dim, index, "scatter_add");
  check_defined(src, "scatter_add", "src");
  if (src.device() != x.device()) [[unlikely]] check_same_device("scatter_add", {&x, &src});
  check_same_dtype("scatter_add", x, src);
  WEFT_CHECK(x.dtype() != DType::Bool, "scatter_add: not defined for bool tensors");
  WEFT_CHECK(src.dim() == index.dim(), "scatter_add: src must have the index's number of dimensions, got src shape ",
             src.shape(), " and index shape ", index.shape());
  check_fits(index, src, -1, "scatter_add", "src");
  const int64_t n = x.dim() == 0 ? 1 : x.shape()[d];
  Tensor idx = index.detach().contiguous();
  check_in_range(idx, index.shape(), n, "scatter_add", dim_str(d, n));

  Tensor out = x.detach().clone();
  scatter_add_into(out, d, idx, src.detach());

  if (any_requires_grad(x, src)) {
    set_history(out, make_node(
                         "ScatterAddBackward",
                         [d, si = SavedTensor(idx), src_shape = src.shape(), gx = x.requires_grad(),
                          gs = src.requires_grad()](const GradList& g) -> GradList {
                           Tensor grad_src;
                           if (gs) {
                             const Tensor& idx = si.unpack();
                             grad_src = gather(g[0], d, idx);
                             if (idx.shape() != src_shape) {  // src positions the index never reads get zeros
                               Tensor full = zeros(src_shape, TensorOptions(g[0].dtype(), g[0].device()));
                               Tensor region = full;
                               for (int64_t k = 0; k < idx.dim(); ++k) region = region.narrow(k, 0, idx.shape()[k]);
                               copy_values(region, grad_src);
                               grad_src = full;
                             }
                           }
                           return {gx ? g[0] : Tensor(), grad_src};
                         },
                         x, src));
  }
  return out;
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  check_index_tensor(index, Tensor(), "one_hot", "index");
  WEFT_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (infer) or non-negative, got ", num_classes);
  Tensor idx = index.detach().contiguous();
  if (num_classes == -1) {
    WEFT_CHECK(index.numel() > 0, "one_hot: cannot infer the number of classes from an empty index; pass num_classes");
    IndexRange range = index_range_stub(idx.device(), idx, std::numeric_limits<int64_t>::max(), "one_hot", true);
    WEFT_CHECK(range.first_bad < 0, "one_hot: index ", range.bad_value, " at position ",
               position_str(range.first_bad, index.shape()), " is negative; class values must be non-negative");
    num_classes = range.max + 1;
  } else {
    check_in_range(idx, index.shape(), num_classes, "one_hot", std::to_string(num_classes) + " classes");
  }
  Shape shape = index.shape();
  WEFT_CHECK(shape.size() < kMaxDims, "one_hot: the index has ", shape.size(), " dimensions; the result would exceed ",
             kMaxDims);
  shape.push_back(num_classes);
  Tensor out = zeros(shape, TensorOptions(DType::Int64, index.device()));
  if (idx.numel() > 0) {
    Shape column = index.shape();
    column.push_back(1);
    Tensor one = ones({1}, TensorOptions(DType::Int64, index.device())).expand(column);
    scatter_add_into(out, shape.size() - 1, idx.view(column), one);
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  check_defined(weight, "embedding", "weight");
  check_index_tensor(indices, weight, "embedding", "indices");
  check_dim(weight, 2, "embedding", "weight");
  check_supported(weight.dtype(), "embedding");
  const int64_t rows = weight.shape()[0], width = weight.shape()[1];
  int64_t skip = -1;
  if (padding_idx) {
    WEFT_CHECK(*padding_idx >= -rows && *padding_idx < rows, "embedding: padding_idx ", *padding_idx,
               " is out of range for a weight of ", rows, " rows (expected ", -rows, " <= padding_idx < ", rows, ")");
    skip = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
  }
  Tensor idx = indices.detach().contiguous();
  check_in_range(idx, indices.shape(), rows, "embedding",
                 "a weight of " + std::to_string(rows) + " rows (shape " + weight.shape().str() + ")");
  Shape shape = indices.shape();
  WEFT_CHECK(shape.size() < kMaxDims, "embedding: indices have ", shape.size(),
             " dimensions; the result would exceed ", kMaxDims);
  shape.push_back(width);

  Tensor out = empty(shape, TensorOptions(weight.dtype(), weight.device()));
  if (out.numel() > 0) index_select_stub(weight.device(), weight.detach().contiguous(), idx, out, 1, rows, width);

  if (any_requires_grad(weight)) {
    set_history(out, make_node(
                         "EmbeddingBackward",
                         [rows, width, skip, si = SavedTensor(idx)](const GradList& g) -> GradList {
                           Tensor grad = zeros({rows, width}, TensorOptions(g[0].dtype(), g[0].device()));
                           if (g[0].numel() > 0)
                             index_add_stub(grad.device(), g[0].contiguous(), si.unpack(), grad, 1, rows, width, skip);
                           return {grad};
                         },
                         weight));
  }
  return out;
}

}  // namespace weft
