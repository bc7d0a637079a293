// Reductions: dim handling, the [outer, inner, post] layout (no copy when it can be read in
// place), and backward.
#include "kernels/reduce.h"

#include <algorithm>

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/elementwise.h"
#include "kernels/reduce_kernels.h"

namespace weft {

constinit DispatchStub<ReduceFn> reduce_stub{"reduce"};

namespace {

// Which dims a reduction covers; empty `dims` means all.
std::vector<bool> reduced_mask(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> mask(x.dim(), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, x.dim(), op);
    if (x.dim() == 0) continue;
    WEFT_CHECK(!mask[w], op, ": dim ", w, " appears more than once in the reduction dims");
    mask[w] = true;
  }
  return mask;
}

Shape reduced_shape(const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!mask[d]) out.push_back(x.shape()[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// x as the kernel reads it: [outer, inner, post] (kernels/reduce_kernels.h).
struct ReduceLayout {
  Tensor in;
  int64_t outer = 1, inner = 1, post = 1;
};

// A contiguous x whose reduced dims are adjacent (ignoring dims of size 1) is read in
// place: rows when they are last, columns otherwise. Any other x is permuted (reduced
// dims last) and copied into rows.
ReduceLayout reduce_layout(const Tensor& x, const std::vector<bool>& mask) {
  ReduceLayout l;
  if (x.is_contiguous()) {
    enum { kLeading, kReduced, kTrailing } phase = kLeading;
    bool adjacent = true;
    for (int64_t d = 0; d < x.dim(); ++d) {
      int64_t size = x.shape()[d];
      if (size == 1) continue;
      if (mask[d]) {
        adjacent = adjacent && phase != kTrailing;
        phase = kReduced;
        l.inner *= size;
      } else if (phase == kLeading) {
        l.outer *= size;
      } else {
        phase = kTrailing;
        l.post *= size;
      }
    }
    if (adjacent) {
      l.in = x;
      return l;
    }
  }
  l = ReduceLayout();
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!mask[d]) order.push_back(d), l.outer *= x.shape()[d];
  for (int64_t d = 0; d < x.dim(); ++d)
    if (mask[d]) order.push_back(d), l.inner *= x.shape()[d];
  NoGradGuard no_grad;
  l.in = x.detach().permute(order).contiguous();
  return l;
}

// Runs `op` over the masked dims of x in one kernel call.
// Ops other than Sum, Mean and Var have no value for an empty row: reducing a dim of size
// 0 fails. For ArgMax / ArgMin, `values` (when defined) receives the selected values.
Tensor reduce_forward(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, bool keepdim, DType out_dtype,
                      const char* name, double correction = 0, const Tensor& values = Tensor()) {
  check_supported(x.dtype(), name);
  WEFT_CHECK(x.dtype() != DType::Bool, name, ": not defined for bool tensors (convert with .to(DType))");
  if (op != ReduceOp::Sum && op != ReduceOp::Mean && op != ReduceOp::Var) {
    for (int64_t d = 0; d < x.dim(); ++d)
      WEFT_CHECK(!mask[d] || x.shape()[d] > 0, name, ": cannot reduce over dim ", d,
                 ", which has size 0 (input shape ", x.shape(), "): the result would have no value");
  }
  ReduceLayout l = reduce_layout(x, mask);
  Tensor out = empty(reduced_shape(x, mask, keepdim), TensorOptions(out_dtype, x.device()));
  if (out.numel() > 0) reduce_stub(x.device(), op, l.in, l.outer, l.inner, l.post, out, values, correction);
  return out;
}

// Gradient of a reduction that sends g (shaped `kept`, keepdim applied) to every input
// element along the reduced dims, scaled by `weights` (broadcast to x's shape).
Tensor spread(const Tensor& g, const Shape& kept, const Tensor& weights) { return mul(weights, g.reshape(kept)); }

// amax / amin: the gradient is split evenly among the elements equal to the result.
Tensor extremum(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* name,
                const char* node_name) {
  check_defined(x, name, "input");
  auto mask = reduced_mask(x, dims, name);
  Tensor out = reduce_forward(op, x, mask, keepdim, x.dtype(), name);
  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         node_name,
                         [sx = SavedTensor(x), so = SavedTensor(out, true), dims = dims,
                          kept = reduced_shape(x, mask, true)](const GradList& g) -> GradList {
                           const Tensor& input = sx.unpack();
                           Tensor hits = eq(input, so.unpack().reshape(kept)).to(input.dtype());
                           Tensor share = div(hits, sum(hits, dims, true));
                           return {spread(g[0], kept, share)};
                         },
                         x));
  }
  return out;
}

// argmax / argmin: with no dim, over the flattened tensor.
Tensor arg_extremum(ReduceOp op, const Tensor& x, std::optional<int64_t> dim, bool keepdim, const char* name) {
  check_defined(x, name, "input");
  if (!dim) {
    WEFT_CHECK(x.numel() > 0, name, ": cannot take the ", name, " of an empty tensor (shape ", x.shape(), ")");
    Tensor flat = x.detach().reshape({x.numel()});
    Tensor out = reduce_forward(op, flat, {true}, false, DType::Int64, name);
    return keepdim ? out.reshape(Shape(std::vector<int64_t>(x.dim(), 1))) : out;
  }
  return reduce_forward(op, x, reduced_mask(x, {*dim}, name), keepdim, DType::Int64, name);
}

// max / min along one dim: values and the index of the first extremum. The gradient
// goes to that index only.
std::pair<Tensor, Tensor> extremum_with_index(ReduceOp op, const Tensor& x, int64_t dim, bool keepdim,
                                              const char* name, const char* node_name) {
  check_defined(x, name, "input");
  auto mask = reduced_mask(x, {dim}, name);
  Tensor values = empty(reduced_shape(x, mask, keepdim), TensorOptions(x.dtype(), x.device()));
  Tensor indices = reduce_forward(op, x, mask, keepdim, DType::Int64, name, 0, values);
  if (any_requires_grad(x)) {
    int64_t d = x.dim() == 0 ? 0 : wrap_dim(dim, x.dim(), name);
    Shape positions_shape(std::vector<int64_t>(x.dim(), 1));
    if (x.dim() > 0) positions_shape[d] = x.shape()[d];
    set_history(values, make_node(
                            node_name,
                            [si = SavedTensor(indices), positions_shape, kept = reduced_shape(x, mask, true)](const GradList& g) -> GradList {
                              Tensor positions = arange(positions_shape.numel(), TensorOptions(DType::Int64, g[0].device()))
                                                     .view(positions_shape);
                              Tensor hit = eq(positions, si.unpack().reshape(kept));
                              Tensor zero = scalar_tensor(0.0, TensorOptions(g[0].dtype(), g[0].device()));
                              return {where(hit, g[0].reshape(kept), zero)};
                            },
                            x));
  }
  return {values, indices};
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(x, "sum", "input");
  auto mask = reduced_mask(x, dims, "sum");
  if (!is_floating(x.dtype())) {
    // Integers and bools are summed, and returned, as int64 (PyTorch's rule): a uint8 or
    // int32 accumulator would wrap around. No gradient flows through integers.
    check_supported(x.dtype(), "sum");
    const Tensor wide = x.dtype() == DType::Int64 ? x : x.to(DType::Int64);
    return reduce_forward(ReduceOp::Sum, wide, mask, keepdim, DType::Int64, "sum");
  }
  Tensor out = reduce_forward(ReduceOp::Sum, x, mask, keepdim, x.dtype(), "sum");
  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         "SumBackward",
                         [shape = x.shape(), kept = reduced_shape(x, mask, true)](const GradList& g) -> GradList {
                           return {g[0].reshape(kept).expand(shape).contiguous()};
                         },
                         x));
  }
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(x, "mean", "input");
  check_floating(x, "mean");
  auto mask = reduced_mask(x, dims, "mean");
  Tensor out = reduce_forward(ReduceOp::Mean, x, mask, keepdim, x.dtype(), "mean");
  if (any_requires_grad(x)) {
    int64_t count = std::max<int64_t>(1, x.numel() / std::max<int64_t>(1, out.numel()));
    set_history(out, make_node(
                         "MeanBackward",
                         [shape = x.shape(), kept = reduced_shape(x, mask, true), count](const GradList& g) -> GradList {
                           return {div(g[0].reshape(kept), static_cast<double>(count)).expand(shape).contiguous()};
                         },
                         x));
  }
  return out;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::Max, x, dims, keepdim, "amax", "AmaxBackward");
}

Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::Min, x, dims, keepdim, "amin", "AminBackward");
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  check_defined(x, "var", "input");
  check_floating(x, "var");
  auto mask = reduced_mask(x, dims, "var");
  Tensor out = reduce_forward(ReduceOp::Var, x, mask, keepdim, x.dtype(), "var", static_cast<double>(correction));
  if (any_requires_grad(x)) {
    int64_t count = x.numel() / std::max<int64_t>(1, out.numel());
    // d var / d x_i = 2 (x_i - mean) / (N - correction).
    double scale = 2.0 / std::max<double>(0.0, static_cast<double>(count - correction));
    set_history(out, make_node(
                         "VarBackward",
                         [sx = SavedTensor(x), dims, scale, kept = reduced_shape(x, mask, true)](const GradList& g) -> GradList {
                           const Tensor& input = sx.unpack();
                           Tensor centered = sub(input, mean(input, dims, true));
                           return {spread(g[0], kept, mul(centered, scale))};
                         },
                         x));
  }
  return out;
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(ReduceOp::ArgMax, x, dim, keepdim, "argmax");
}

Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(ReduceOp::ArgMin, x, dim, keepdim, "argmin");
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_with_index(ReduceOp::ArgMax, x, dim, keepdim, "max", "MaxBackward");
}

std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_with_index(ReduceOp::ArgMin, x, dim, keepdim, "min", "MinBackward");
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  WEFT_CHECK(broadcasts_to(shape, x.shape()), "sum_to_shape: shape ", shape,
             " does not broadcast to ", x.shape());
  int64_t lead = x.dim() - shape.size();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  Tensor reduced = dims.empty() ? x : sum(x, dims, true);
  return reduced.reshape(shape);
}

}  // namespace weft
