// layer_norm: argument checks, the [rows, n] view the kernels see, dispatch, and the
// backward node.
#include "kernels/layer_norm.h"

#include <string>

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/layer_norm_kernels.h"

namespace weft {

constinit DispatchStub<LayerNormForwardFn> layer_norm_forward_stub{"layer_norm"};
constinit DispatchStub<LayerNormBackwardFn> layer_norm_backward_stub{"layer_norm backward"};

namespace {

// weight or bias: undefined, or shaped normalized_shape with x's dtype and device.
void check_affine(const Tensor& x, const Tensor& t, const Shape& normalized_shape, const char* arg) {
  if (!t.defined()) return;
  WEFT_CHECK(t.shape() == normalized_shape, "layer_norm: expected ", arg, " of shape ", normalized_shape,
             " (normalized_shape), got shape ", t.shape());
  WEFT_CHECK(t.dtype() == x.dtype(), "layer_norm: ", arg, " is ", t.dtype(), " but input is ", x.dtype(),
             " (weft does not promote; convert one with .to(DType))");
  WEFT_CHECK(t.device() == x.device(), "layer_norm: ", arg, " is on ", t.device(), " but input is on ", x.device(),
             " (move one with .to(device))");
}

// Whether x's trailing dims are normalized_shape.
bool ends_with(const Shape& shape, const Shape& tail) {
  if (shape.size() < tail.size()) return false;
  for (int64_t d = 0; d < tail.size(); ++d)
    if (shape[shape.size() - tail.size() + d] != tail[d]) return false;
  return true;
}

// The kernels' view of a defined weight or bias: contiguous [n], detached (the node keeps
// its own edge to the original).
Tensor as_row(const Tensor& t, int64_t n) { return t.defined() ? t.detach().contiguous().view({n}) : Tensor(); }

SavedTensor save_optional(const Tensor& t) { return t.defined() ? SavedTensor(t) : SavedTensor(); }

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_defined(x, "layer_norm", "input");
  check_floating(x, "layer_norm");
  WEFT_CHECK(!normalized_shape.empty(), "layer_norm: normalized_shape must have at least one dim, got []");
  WEFT_CHECK(ends_with(x.shape(), normalized_shape), "layer_norm: input shape ", x.shape(),
             " does not end with normalized_shape ", normalized_shape, " (expected input of shape [*, ",
             normalized_shape.str().substr(1), ")");
  check_affine(x, weight, normalized_shape, "weight");
  check_affine(x, bias, normalized_shape, "bias");
  WEFT_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);

  // Rows are the leading dims, n the normalised ones. detach() keeps the storage (and its
  // version) when x is already contiguous, so the saved tensor notices a later in-place write.
  const int64_t n = normalized_shape.numel();
  int64_t rows = 1;
  for (int64_t d = 0; d < x.dim() - normalized_shape.size(); ++d) rows *= x.size(d);
  const bool empty_input = rows == 0 || n == 0;
  Tensor x2d = x.detach().contiguous().view({rows, n});
  Tensor w = as_row(weight, n), b = as_row(bias, n);
  const TensorOptions options(x.dtype(), x.device());
  Tensor y = empty(x.shape(), options);
  Tensor mean = empty({rows}, options), rstd = empty({rows}, options);
  if (!empty_input) layer_norm_forward_stub(x.device(), x2d, w, b, eps, y.view({rows, n}), mean, rstd);

  if (any_requires_grad(x, weight, bias)) {
    set_history(y, make_node(
                       "LayerNormBackward",
                       [sx = SavedTensor(x2d), smean = SavedTensor(mean), srstd = SavedTensor(rstd),
                        sweight = save_optional(w), shape = x.shape(), normalized_shape, empty_input,
                        need_x = x.requires_grad(), need_weight = weight.defined() && weight.requires_grad(),
                        need_bias = bias.defined() && bias.requires_grad()](const GradList& grads) -> GradList {
                         const Tensor& x2d = sx.unpack();
                         const Tensor& gy = grads[0];
                         const TensorOptions opts(gy.dtype(), gy.device());
                         // An empty input has empty grad_x, and zero parameter gradients (sums
                         // over no rows).
                         if (empty_input) {
                           return {need_x ? zeros(shape, opts) : Tensor(),
                                   need_weight ? zeros(normalized_shape, opts) : Tensor(),
                                   need_bias ? zeros(normalized_shape, opts) : Tensor()};
                         }
                         const int64_t n = x2d.size(1);
                         Tensor gx = need_x ? empty(shape, opts) : Tensor();
                         Tensor gw = need_weight ? empty(normalized_shape, opts) : Tensor();
                         Tensor gb = need_bias ? empty(normalized_shape, opts) : Tensor();
                         layer_norm_backward_stub(gy.device(), gy.contiguous().view(x2d.shape()), x2d, smean.unpack(),
                                                  srstd.unpack(), sweight.defined() ? sweight.unpack() : Tensor(),
                                                  need_x ? gx.view(x2d.shape()) : Tensor(),
                                                  need_weight ? gw.view({n}) : Tensor(),
                                                  need_bias ? gb.view({n}) : Tensor());
                         return {gx, gw, gb};
                       },
                       x, weight, bias));
  }
  return y;
}

}  // namespace weft
