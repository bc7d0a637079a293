// Losses: argument checks, the [N, C, post] layout, reduction and backward.
#include "kernels/loss.h"

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/elementwise.h"
#include "kernels/loss_kernels.h"
#include "kernels/reduce.h"

namespace weft {

constinit DispatchStub<NllLossFn> nll_loss_stub{"nll_loss"};
constinit DispatchStub<NllLossBackwardFn> nll_loss_backward_stub{"nll_loss_backward"};
constinit DispatchStub<CrossEntropyFn> cross_entropy_stub{"cross_entropy"};
constinit DispatchStub<CrossEntropyBackwardFn> cross_entropy_backward_stub{"cross_entropy_backward"};
constinit DispatchStub<MseLossFn> mse_loss_stub{"mse_loss"};
constinit DispatchStub<MseLossBackwardFn> mse_loss_backward_stub{"mse_loss_backward"};

namespace {

// A class loss's input read as [n, c, post], its checked contiguous operands, and the
// shape of its unreduced loss (the target's shape).
struct ClassLoss {
  int64_t n = 1, c = 1, post = 1;
  Tensor input, target, weight;
  Shape loss_shape;
};

// Checks (input, target, weight) of nll_loss / cross_entropy; `input_name` is the
// argument's name in the messages.
ClassLoss check_class_loss(const char* op, const char* input_name, const Tensor& input, const Tensor& target,
                           const Tensor& weight) {
  check_defined(input, op, input_name);
  check_defined(target, op, "target");
  check_floating(input, op);
  WEFT_CHECK(target.dtype() == DType::Int64, op, ": expected 'target' to hold class indices of dtype int64, got ",
             target.dtype(), " (weft takes no class-probability targets; convert indices with .to(DType::Int64))");
  WEFT_CHECK(input.dim() >= 1, op, ": expected '", input_name, "' of shape [C], [N, C] or [N, C, d1, ...], got a 0-d tensor");
  check_same_device(op, {&input, &target});
  ClassLoss l;
  // The target's expected shape: the input's without the class dim (dim 1; dim 0 for [C]).
  Shape expected = input.shape();
  int64_t class_dim = input.dim() == 1 ? 0 : 1;
  expected.erase(class_dim);
  WEFT_CHECK(target.shape() == expected, op, ": target shape ", target.shape(), " does not match ", input_name,
             " shape ", input.shape(), " (expected target shape ", expected, ": the ", input_name,
             "'s shape without its class dim ", class_dim, ")");
  l.c = input.shape()[class_dim];
  if (input.dim() >= 2) {
    l.n = input.shape()[0];
    for (int64_t d = 2; d < input.dim(); ++d) l.post *= input.shape()[d];
  }
  if (weight.defined()) {
    check_same_device(op, {&input, &weight});
    WEFT_CHECK(weight.dim() == 1 && weight.shape()[0] == l.c, op, ": expected 'weight' of shape [", l.c,
               "] (one weight per class), got ", weight.shape());
    WEFT_CHECK(weight.dtype() == input.dtype(), op, ": 'weight' has dtype ", weight.dtype(), " but '", input_name,
               "' has ", input.dtype(), " (weft does not promote; convert one with .to(DType))");
    WEFT_CHECK(!any_requires_grad(weight), op,
               ": 'weight' requires grad, but class weights are not differentiable (pass weight.detach())");
  }
  NoGradGuard no_grad;
  l.input = input.contiguous();
  l.target = target.contiguous();
  if (weight.defined()) l.weight = weight.contiguous();
  l.loss_shape = target.shape();
  return l;
}

[[noreturn]] void fail_target(const char* op, const ClassLoss& l, int64_t flat, int64_t ignore_index) {
  int64_t value = l.target.reshape({l.target.numel()}).select(0, flat).item<int64_t>();
  Shape index = l.loss_shape;
  for (int64_t d = index.size() - 1, rest = flat; d >= 0; --d) {
    int64_t size = l.loss_shape[d];
    index[d] = rest % size;
    rest /= size;
  }
  WEFT_FAIL(op, ": target value ", value, " at position ", index, " is out of range for ", l.c,
            " classes (expected 0 .. ", l.c - 1, ", or ignore_index ", ignore_index, ")");
}

// Reduces per-position losses; for Mean, `denominator` receives the weight sum that
// backward divides by.
Tensor reduce_loss(const Tensor& loss, const Tensor& target_weight, const Shape& loss_shape, Reduction reduction,
                   Tensor& denominator) {
  NoGradGuard no_grad;
  switch (reduction) {
    case Reduction::None: return loss.view(loss_shape);
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: denominator = sum(target_weight); return div(sum(loss), denominator);
  }
  return Tensor();
}

// The upstream gradient as the backward kernels read it: one value per position, or one
// value for all (already divided by the Mean denominator).
Tensor position_grad(const Tensor& g, Reduction reduction, const Tensor& denominator) {
  if (reduction == Reduction::Mean) return div(g, denominator);
  return g.contiguous();
}

SavedTensor save_if_defined(const Tensor& t) { return t.defined() ? SavedTensor(t) : SavedTensor(); }
Tensor unpack_if_defined(const SavedTensor& s) { return s.defined() ? s.unpack() : Tensor(); }

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index,
                const Tensor& weight) {
  ClassLoss l = check_class_loss("nll_loss", "log_probs", log_probs, target, weight);
  const int64_t positions = l.n * l.post;
  TensorOptions options(log_probs.dtype(), log_probs.device());
  Tensor loss = empty({positions}, options);
  Tensor target_weight = reduction == Reduction::Mean ? empty({positions}, options) : Tensor();
  int64_t bad = positions == 0 ? -1
                               : nll_loss_stub(log_probs.device(), l.input, l.target, l.weight, l.n, l.c, l.post,
                                               ignore_index, loss, target_weight);
  if (bad >= 0) fail_target("nll_loss", l, bad, ignore_index);
  Tensor denominator;
  Tensor out = reduce_loss(loss, target_weight, l.loss_shape, reduction, denominator);
  if (any_requires_grad(log_probs)) {
    set_history(out, make_node(
                         "NllLossBackward",
                         [st = SavedTensor(l.target), sw = save_if_defined(l.weight), denominator, reduction,
                          shape = log_probs.shape(), n = l.n, c = l.c, post = l.post,
                          ignore_index](const GradList& g) -> GradList {
                           Tensor grad = position_grad(g[0], reduction, denominator);
                           Tensor grad_in = empty(shape, TensorOptions(grad.dtype(), grad.device()));
                           if (grad_in.numel() > 0)
                             nll_loss_backward_stub(grad.device(), grad, st.unpack(), unpack_if_defined(sw), n, c,
                                                    post, ignore_index, grad_in);
                           return {grad_in};
                         },
                         log_probs));
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index,
                     const Tensor& weight, double label_smoothing) {
  ClassLoss l = check_class_loss("cross_entropy", "logits", logits, target, weight);
  WEFT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
             "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  const int64_t positions = l.n * l.post;
  TensorOptions options(logits.dtype(), logits.device());
  Tensor loss = empty({positions}, options);
  Tensor target_weight = reduction == Reduction::Mean ? empty({positions}, options) : Tensor();
  Tensor lse = empty({positions}, TensorOptions(DType::Float64, logits.device()));
  int64_t bad = positions == 0 ? -1
                               : cross_entropy_stub(logits.device(), l.input, l.target, l.weight, l.n, l.c, l.post,
                                                    ignore_index, label_smoothing, loss, target_weight, lse);
  if (bad >= 0) fail_target("cross_entropy", l, bad, ignore_index);
  Tensor denominator;
  Tensor out = reduce_loss(loss, target_weight, l.loss_shape, reduction, denominator);
  if (any_requires_grad(logits)) {
    set_history(out, make_node(
                         "CrossEntropyBackward",
                         [sx = SavedTensor(l.input), st = SavedTensor(l.target), sw = save_if_defined(l.weight), lse,
                          denominator, reduction, n = l.n, c = l.c, post = l.post, ignore_index,
                          label_smoothing](const GradList& g) -> GradList {
                           const Tensor& x = sx.unpack();
                           Tensor grad = position_grad(g[0], reduction, denominator);
                           Tensor grad_in = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
                           if (grad_in.numel() > 0)
                             cross_entropy_backward_stub(x.device(), grad, x, st.unpack(), unpack_if_defined(sw), lse,
                                                         n, c, post, ignore_index, label_smoothing, grad_in);
                           return {grad_in};
                         },
                         logits));
  }
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  check_defined(input, op, "input");
  check_defined(target, op, "target");
  check_floating(input, op);
  check_same_dtype(op, input, target);
  check_same_device(op, {&input, &target});
  WEFT_CHECK(input.shape() == target.shape(), op, ": input shape ", input.shape(), " and target shape ",
             target.shape(), " differ (weft does not broadcast in losses, where it usually hides a bug; expand or "
             "reshape one explicitly)");
  Tensor a, b;
  {
    NoGradGuard no_grad;
    a = input.contiguous();
    b = target.contiguous();
  }
  Tensor out = empty(reduction == Reduction::None ? input.shape() : Shape{},
                     TensorOptions(input.dtype(), input.device()));
  if (reduction != Reduction::None || out.numel() > 0) mse_loss_stub(input.device(), a, b, reduction, out);
  if (any_requires_grad(input, target)) {
    double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(input.numel()) : 1.0;
    set_history(out, make_node(
                         "MseLossBackward",
                         [sa = SavedTensor(a), sb = SavedTensor(b), scale, ga = input.requires_grad(),
                          gb = target.requires_grad()](const GradList& g) -> GradList {
                           const Tensor& x = sa.unpack();
                           TensorOptions options(x.dtype(), x.device());
                           Tensor grad_input = ga ? empty(x.shape(), options) : Tensor();
                           Tensor grad_target = gb ? empty(x.shape(), options) : Tensor();
                           if (x.numel() > 0)
                             mse_loss_backward_stub(x.device(), g[0].contiguous(), x, sb.unpack(), scale, grad_input,
                                                    grad_target);
                           return {grad_input, grad_target};
                         },
                         input, target));
  }
  return out;
}

}  // namespace weft
