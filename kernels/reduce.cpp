// Reductions: dim handling, the permute-to-rows layout, and backward.
#include "kernels/reduce.h"

#include <algorithm>

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/elementwise.h"
#include "kernels/reduce_kernels.h"

namespace weft {

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

}  // namespace

// Runs `op` over the masked dims of x: kept dims first, reduced dims last, contiguous,
// then one kernel call over [outer, inner] rows. Returns the result in the kept-dims
// shape (keepdim applied by the caller through reshape).
Tensor reduce_forward(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, bool keepdim, DType out_dtype,
                      double correction, const char* name) {
  check_supported(x.dtype(), name);
  WEFT_CHECK(x.dtype() != DType::Bool, name, ": not defined for bool tensors");
  Tensor rows;
  int64_t outer = 1, inner = 1;
  {
    NoGradGuard no_grad;
    std::vector<int64_t> order;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!mask[d]) order.push_back(d), outer *= x.shape()[d];
    for (int64_t d = 0; d < x.dim(); ++d)
      if (mask[d]) order.push_back(d), inner *= x.shape()[d];
    rows = x.detach().permute(order).contiguous();
  }
  WEFT_CHECK(inner > 0 || op == ReduceOp::Sum || op == ReduceOp::Mean, name,
             ": cannot reduce over an empty dimension (shape ", x.shape(), ")");
  Tensor out = empty(reduced_shape(x, mask, keepdim), TensorOptions(out_dtype, x.device()));
  if (outer > 0) reduce_stub(x.device(), op, rows, outer, inner, out, correction);
  return out;
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(x, "sum", "input");
  auto mask = reduced_mask(x, dims, "sum");
  Tensor out = reduce_forward(ReduceOp::Sum, x, mask, keepdim, x.dtype(), 0, "sum");
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
  Tensor out = reduce_forward(ReduceOp::Mean, x, mask, keepdim, x.dtype(), 0, "mean");
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

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  WEFT_CHECK(broadcast_shapes(shape, x.shape(), "sum_to_shape") == x.shape(), "sum_to_shape: shape ", shape,
             " does not broadcast to ", x.shape());
  int64_t lead = x.dim() - shape.size();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  Tensor reduced = dims.empty() ? x : sum(x, dims, true);
  return reduced.reshape(shape);
}

}  // namespace weft
