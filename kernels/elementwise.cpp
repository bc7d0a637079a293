// Elementwise ops: checks, dispatch, and each op's backward next to its forward.
#include "kernels/elementwise.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/copy.h"
#include "kernels/checks.h"
#include "kernels/elementwise_kernels.h"
#include "kernels/reduce.h"

namespace weft {

constinit DispatchStub<BinaryFn> binary_stub{"binary op"};
constinit DispatchStub<UnaryFn> unary_stub{"unary op"};
constinit DispatchStub<WhereFn> where_stub{"where"};

namespace {

Tensor binary_forward(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  check_defined(a, name, "a");
  check_defined(b, name, "b");
  if (a.device() != b.device()) [[unlikely]] check_same_device(name, {&a, &b});
  if (a.dtype() != b.dtype()) [[unlikely]] check_same_dtype(name, a, b);
  if (!is_comparison(op)) {
    WEFT_CHECK(a.dtype() != DType::Bool, name, ": arithmetic on bool tensors is not supported");
    if (op == BinaryOp::Div || op == BinaryOp::Pow || op >= BinaryOp::ReluBackward) check_floating(a, name);
  }
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, TensorOptions(is_comparison(op) ? DType::Bool : a.dtype(), a.device()));
  if (out.numel() > 0) binary_stub(a.device(), op, a, b, out);
  return out;
}

Tensor unary_forward(UnaryOp op, const char* name, const Tensor& x, bool floating_only, double p0 = 0,
                     double p1 = 0) {
  check_defined(x, name, "input");
  if (floating_only) check_floating(x, name);
  WEFT_CHECK(x.dtype() != DType::Bool, name, ": not defined for bool tensors");
  check_supported(x.dtype(), name);
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) unary_stub(x.device(), op, x, out, p0, p1);
  return out;
}

Tensor zero_like_scalar(const Tensor& t) { return scalar_tensor(0.0, TensorOptions(t.dtype(), t.device())); }

// Records the backward of a binary op whose gradients are f(g) for a and h(g) for b,
// each summed back over the dims that broadcasting added.
template <class F>
void record_binary(const char* name, const Tensor& out, const Tensor& a, const Tensor& b, F grads) {
  if (!any_requires_grad(a, b)) return;
  set_history(out, make_node(
                       name,
                       [grads, ga = a.requires_grad(), gb = b.requires_grad(), sa = a.shape(),
                        sb = b.shape()](const GradList& g) -> GradList {
                         auto [da, db] = grads(g[0], ga, gb);
                         return {ga ? sum_to_shape(da, sa) : Tensor(), gb ? sum_to_shape(db, sb) : Tensor()};
                       },
                       a, b));
}

template <class F>
void record_unary(const char* name, const Tensor& out, const Tensor& x, F grad) {
  if (!any_requires_grad(x)) return;
  set_history(out, make_node(name, [grad](const GradList& g) -> GradList { return {grad(g[0])}; }, x));
}

using Pair = std::pair<Tensor, Tensor>;

// In place: the kernel writes into self when autograd has nothing to record; otherwise
// the op runs out of place on a clone and self takes over the result and its history.
template <class OutOfPlace>
const Tensor& inplace(const Tensor& self, const char* name, OutOfPlace out_of_place) {
  check_defined(self, name, "self");
  check_inplace(self, name);
  return commit_inplace(self, out_of_place(self.clone()), name);
}

const Tensor& binary_inplace(const Tensor& self, const Tensor& other, BinaryOp op, const char* name,
                       Tensor (*out_of_place)(const Tensor&, const Tensor&)) {
  if (any_requires_grad(self, other))
    return inplace(self, name, [&](const Tensor& s) { return out_of_place(s, other); });
  check_defined(self, name, "self");
  check_defined(other, name, "other");
  check_same_device(name, {&self, &other});
  check_same_dtype(name, self, other);
  WEFT_CHECK(broadcasts_to(other.shape(), self.shape()), name, ": other's shape ",
             other.shape(), " does not broadcast to self's shape ", self.shape());
  if (op == BinaryOp::Div) check_floating(self, name);
  if (self.numel() > 0) binary_stub(self.device(), op, self, other, self);
  self.bump_version();
  return self;
}

const Tensor& unary_inplace(const Tensor& self, UnaryOp op, const char* name, bool floating_only, double p0, double p1,
                      const std::function<Tensor(const Tensor&)>& out_of_place) {
  if (any_requires_grad(self)) return inplace(self, name, out_of_place);
  check_defined(self, name, "self");
  if (floating_only) check_floating(self, name);
  WEFT_CHECK(self.dtype() != DType::Bool, name, ": not defined for bool tensors");
  if (self.numel() > 0) unary_stub(self.device(), op, self, self, p0, p1);
  self.bump_version();
  return self;
}

}  // namespace

// --- binary -------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Add, "add", a, b);
  record_binary("AddBackward", out, a, b, [](const Tensor& g, bool, bool) { return Pair{g, g}; });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Sub, "sub", a, b);
  record_binary("SubBackward", out, a, b,
                [](const Tensor& g, bool, bool gb) { return Pair{g, gb ? neg(g) : Tensor()}; });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Mul, "mul", a, b);
  if (any_requires_grad(a, b)) {
    SavedTensor sa(a), sb(b);
    record_binary("MulBackward", out, a, b, [sa, sb](const Tensor& g, bool ga, bool gb) {
      return Pair{ga ? mul(g, sb.unpack()) : Tensor(), gb ? mul(g, sa.unpack()) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Div, "div", a, b);
  if (any_requires_grad(a, b)) {
    SavedTensor sa(a), sb(b);
    record_binary("DivBackward", out, a, b, [sa, sb](const Tensor& g, bool ga, bool gb) {
      const Tensor& bv = sb.unpack();
      return Pair{ga ? div(g, bv) : Tensor(), gb ? neg(div(mul(g, sa.unpack()), mul(bv, bv))) : Tensor()};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Pow, "pow", a, b);
  if (any_requires_grad(a, b)) {
    SavedTensor sa(a), sb(b), so(out, true);
    record_binary("PowBackward", out, a, b, [sa, sb, so](const Tensor& g, bool ga, bool gb) {
      const Tensor& base = sa.unpack();
      const Tensor& exponent = sb.unpack();
      Tensor da, db;
      if (ga) da = mul(mul(g, exponent), pow(base, sub(exponent, 1.0)));
      // d/db a^b = a^b log a; taken as 0 where a == 0 (and the limit is 0), as PyTorch does.
      if (gb) db = where(eq(base, 0.0), zero_like_scalar(g), mul(g, mul(so.unpack(), log(base))));
      return Pair{da, db};
    });
  }
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Maximum, "maximum", a, b);
  if (any_requires_grad(a, b)) {
    SavedTensor sa(a), sb(b);
    // Ties split the gradient evenly, as PyTorch does.
    record_binary("MaximumBackward", out, a, b, [sa, sb](const Tensor& g, bool, bool) {
      const Tensor& x = sa.unpack();
      const Tensor& y = sb.unpack();
      Tensor half = mul(g, 0.5), zero = zero_like_scalar(g);
      return Pair{where(gt(x, y), g, where(eq(x, y), half, zero)), where(lt(x, y), g, where(eq(x, y), half, zero))};
    });
  }
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Minimum, "minimum", a, b);
  if (any_requires_grad(a, b)) {
    SavedTensor sa(a), sb(b);
    record_binary("MinimumBackward", out, a, b, [sa, sb](const Tensor& g, bool, bool) {
      const Tensor& x = sa.unpack();
      const Tensor& y = sb.unpack();
      Tensor half = mul(g, 0.5), zero = zero_like_scalar(g);
      return Pair{where(lt(x, y), g, where(eq(x, y), half, zero)), where(gt(x, y), g, where(eq(x, y), half, zero))};
    });
  }
  return out;
}

// --- tensor (op) scalar ---------------------------------------------------------------

namespace {
Tensor affine(const Tensor& x, double scale, double shift, const char* name, double scalar) {
  check_defined(x, name, "input");
  check_scalar_fits(x, scalar, name);
  Tensor out = unary_forward(UnaryOp::Affine, name, x, false, scale, shift);
  record_unary("AffineBackward", out, x, [scale](const Tensor& g) { return scale == 1.0 ? g : mul(g, scale); });
  return out;
}
}  // namespace

Tensor add(const Tensor& a, double b) { return affine(a, 1.0, b, "add", b); }
Tensor sub(const Tensor& a, double b) { return affine(a, 1.0, -b, "sub", b); }
Tensor mul(const Tensor& a, double b) { return affine(a, b, 0.0, "mul", b); }
Tensor div(const Tensor& a, double b) {
  check_defined(a, "div", "input");
  check_floating(a, "div");
  return affine(a, 1.0 / b, 0.0, "div", b);
}

Tensor pow(const Tensor& a, double exponent) {
  Tensor out = unary_forward(UnaryOp::PowScalar, "pow", a, true, exponent);
  if (any_requires_grad(a)) {
    SavedTensor sa(a);
    record_unary("PowBackward", out, a, [sa, exponent](const Tensor& g) {
      if (exponent == 0.0) return zeros_like(g);
      return mul(g, mul(pow(sa.unpack(), exponent - 1.0), exponent));
    });
  }
  return out;
}

// --- unary ----------------------------------------------------------------------------

Tensor neg(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Neg, "neg", x, false);
  record_unary("NegBackward", out, x, [](const Tensor& g) { return neg(g); });
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Exp, "exp", x, true);
  if (any_requires_grad(x))
    record_unary("ExpBackward", out, x, [so = SavedTensor(out, true)](const Tensor& g) { return mul(g, so.unpack()); });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Log, "log", x, true);
  if (any_requires_grad(x))
    record_unary("LogBackward", out, x, [sx = SavedTensor(x)](const Tensor& g) { return div(g, sx.unpack()); });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sqrt, "sqrt", x, true);
  if (any_requires_grad(x))
    record_unary("SqrtBackward", out, x,
                 [so = SavedTensor(out, true)](const Tensor& g) { return div(g, mul(so.unpack(), 2.0)); });
  return out;
}

Tensor abs(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Abs, "abs", x, false);
  if (any_requires_grad(x))
    record_unary("AbsBackward", out, x, [sx = SavedTensor(x)](const Tensor& g) { return mul(g, sign(sx.unpack())); });
  return out;
}

Tensor sign(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sign, "sign", x, false);
  record_unary("SignBackward", out, x, [](const Tensor& g) { return zeros_like(g); });
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Relu, "relu", x, false);
  if (any_requires_grad(x))
    record_unary("ReluBackward", out, x,
                 [so = SavedTensor(out, true)](const Tensor& g) { return relu_backward(g, so.unpack()); });
  return out;
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sigmoid, "sigmoid", x, true);
  if (any_requires_grad(x))
    record_unary("SigmoidBackward", out, x,
                 [so = SavedTensor(out, true)](const Tensor& g) { return sigmoid_backward(g, so.unpack()); });
  return out;
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Tanh, "tanh", x, true);
  if (any_requires_grad(x))
    record_unary("TanhBackward", out, x,
                 [so = SavedTensor(out, true)](const Tensor& g) { return tanh_backward(g, so.unpack()); });
  return out;
}

Tensor gelu(const Tensor& x, GeluApproximate approximate) {
  const bool tanh_form = approximate == GeluApproximate::Tanh;
  Tensor out = unary_forward(tanh_form ? UnaryOp::GeluTanh : UnaryOp::Gelu, "gelu", x, true);
  if (any_requires_grad(x))
    record_unary(tanh_form ? "GeluTanhBackward" : "GeluBackward", out, x,
                 [sx = SavedTensor(x), approximate](const Tensor& g) {
                   return gelu_backward(g, sx.unpack(), approximate);
                 });
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  check_defined(x, "clamp", "input");
  WEFT_CHECK(min || max, "clamp: at least one of min and max must be given");
  if (min) check_scalar_fits(x, *min, "clamp");
  if (max) check_scalar_fits(x, *max, "clamp");
  constexpr double inf = std::numeric_limits<double>::infinity();
  double lo = min.value_or(-inf), hi = max.value_or(inf);
  Tensor out = unary_forward(UnaryOp::Clamp, "clamp", x, false, lo, hi);
  if (any_requires_grad(x)) {
    // The gradient passes where lo <= x <= hi (bounds included), as in PyTorch.
    record_unary("ClampBackward", out, x, [sx = SavedTensor(x), min, max](const Tensor& g) {
      const Tensor& v = sx.unpack();
      Tensor zero = zero_like_scalar(g), grad = g;
      if (min) grad = where(lt(v, *min), zero, grad);
      if (max) grad = where(gt(v, *max), zero, grad);
      return grad;
    });
  }
  return out;
}

Tensor relu_backward(const Tensor& grad, const Tensor& output) {
  return binary_forward(BinaryOp::ReluBackward, "relu_backward", grad, output);
}
Tensor sigmoid_backward(const Tensor& grad, const Tensor& output) {
  return binary_forward(BinaryOp::SigmoidBackward, "sigmoid_backward", grad, output);
}
Tensor tanh_backward(const Tensor& grad, const Tensor& output) {
  return binary_forward(BinaryOp::TanhBackward, "tanh_backward", grad, output);
}
Tensor gelu_backward(const Tensor& grad, const Tensor& input, GeluApproximate approximate) {
  return binary_forward(approximate == GeluApproximate::Tanh ? BinaryOp::GeluTanhBackward : BinaryOp::GeluBackward,
                        "gelu_backward", grad, input);
}

// --- where and comparisons ------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "condition");
  check_defined(a, "where", "a");
  check_defined(b, "where", "b");
  WEFT_CHECK(cond.dtype() == DType::Bool, "where: condition must be a bool tensor, got ", cond.dtype());
  check_same_device("where", {&cond, &a, &b});
  check_same_dtype("where", a, b);
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, TensorOptions(a.dtype(), a.device()));
  if (out.numel() > 0) where_stub(out.device(), cond, a, b, out);
  if (any_requires_grad(a, b)) {
    set_history(out, make_node(
                         "WhereBackward",
                         [c = SavedTensor(cond), ga = a.requires_grad(), gb = b.requires_grad(), sa = a.shape(),
                          sb = b.shape()](const GradList& g) -> GradList {
                           Tensor zero = zero_like_scalar(g[0]);
                           const Tensor& mask = c.unpack();
                           return {ga ? sum_to_shape(where(mask, g[0], zero), sa) : Tensor(),
                                   gb ? sum_to_shape(where(mask, zero, g[0]), sb) : Tensor()};
                         },
                         a, b));
  }
  return out;
}

#define WEFT_COMPARISON(name, Op)                                                         \
  Tensor name(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Op, #name, a, b); } \
  Tensor name(const Tensor& a, double b) {                                                \
    check_defined(a, #name, "a");                                                         \
    return binary_forward(BinaryOp::Op, #name, a, scalar_tensor(b, TensorOptions(a.dtype(), a.device()))); \
  }
WEFT_COMPARISON(eq, Eq)
WEFT_COMPARISON(ne, Ne)
WEFT_COMPARISON(lt, Lt)
WEFT_COMPARISON(le, Le)
WEFT_COMPARISON(gt, Gt)
WEFT_COMPARISON(ge, Ge)
#undef WEFT_COMPARISON

// --- in place -------------------------------------------------------------------------

const Tensor& add_(const Tensor& self, const Tensor& other) {
  return binary_inplace(self, other, BinaryOp::Add, "add_", [](const Tensor& a, const Tensor& b) { return add(a, b); });
}
const Tensor& sub_(const Tensor& self, const Tensor& other) {
  return binary_inplace(self, other, BinaryOp::Sub, "sub_", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
}
const Tensor& mul_(const Tensor& self, const Tensor& other) {
  return binary_inplace(self, other, BinaryOp::Mul, "mul_", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
}
const Tensor& div_(const Tensor& self, const Tensor& other) {
  return binary_inplace(self, other, BinaryOp::Div, "div_", [](const Tensor& a, const Tensor& b) { return div(a, b); });
}

const Tensor& add_(const Tensor& self, double other) {
  check_defined(self, "add_", "self");
  check_scalar_fits(self, other, "add_");
  return unary_inplace(self, UnaryOp::Affine, "add_", false, 1.0, other, [&](const Tensor& s) { return add(s, other); });
}
const Tensor& sub_(const Tensor& self, double other) {
  check_defined(self, "sub_", "self");
  check_scalar_fits(self, other, "sub_");
  return unary_inplace(self, UnaryOp::Affine, "sub_", false, 1.0, -other, [&](const Tensor& s) { return sub(s, other); });
}
const Tensor& mul_(const Tensor& self, double other) {
  check_defined(self, "mul_", "self");
  check_scalar_fits(self, other, "mul_");
  return unary_inplace(self, UnaryOp::Affine, "mul_", false, other, 0.0, [&](const Tensor& s) { return mul(s, other); });
}
const Tensor& div_(const Tensor& self, double other) {
  check_defined(self, "div_", "self");
  check_floating(self, "div_");
  return unary_inplace(self, UnaryOp::Affine, "div_", true, 1.0 / other, 0.0,
                       [&](const Tensor& s) { return div(s, other); });
}

#define WEFT_UNARY_INPLACE(name, Op, floating_only)                                               \
  const Tensor& name##_(const Tensor& self) {                                                     \
    return unary_inplace(self, UnaryOp::Op, #name "_", floating_only, 0, 0,                        \
                         [](const Tensor& s) { return name(s); });                                \
  }
WEFT_UNARY_INPLACE(neg, Neg, false)
WEFT_UNARY_INPLACE(exp, Exp, true)
WEFT_UNARY_INPLACE(log, Log, true)
WEFT_UNARY_INPLACE(sqrt, Sqrt, true)
WEFT_UNARY_INPLACE(abs, Abs, false)
WEFT_UNARY_INPLACE(relu, Relu, false)
WEFT_UNARY_INPLACE(sigmoid, Sigmoid, true)
WEFT_UNARY_INPLACE(tanh, Tanh, true)
#undef WEFT_UNARY_INPLACE

const Tensor& pow_(const Tensor& self, double exponent) {
  return unary_inplace(self, UnaryOp::PowScalar, "pow_", true, exponent, 0,
                       [&](const Tensor& s) { return pow(s, exponent); });
}

const Tensor& clamp_(const Tensor& self, std::optional<double> min, std::optional<double> max) {
  check_defined(self, "clamp_", "self");
  WEFT_CHECK(min || max, "clamp_: at least one of min and max must be given");
  constexpr double inf = std::numeric_limits<double>::infinity();
  return unary_inplace(self, UnaryOp::Clamp, "clamp_", false, min.value_or(-inf), max.value_or(inf),
                       [&](const Tensor& s) { return clamp(s, min, max); });
}

const Tensor& fill_(const Tensor& self, double value) {
  check_defined(self, "fill_", "self");
  check_scalar_fits(self, value, "fill_");
  if (any_requires_grad(self)) {
    check_inplace(self, "fill_");
    return commit_inplace(self, full_like(self, value), "fill_");
  }
  if (self.numel() > 0) fill_stub(self.device(), self, value);
  self.bump_version();
  return self;
}

const Tensor& zero_(const Tensor& self) { return fill_(self, 0.0); }

}  // namespace weft
