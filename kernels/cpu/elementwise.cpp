// CPU elementwise kernels: binary (with broadcasting), unary, where.
//
// Each op is a scalar functor; the loops come from kernels/cpu/loops.h. Contiguous
// same-shape operands skip the strided machinery entirely: that path is what a
// one-element op (and the op_overhead benchmark) pays for.
#include <cmath>
#include <numbers>
#include <type_traits>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/loops.h"
#include "kernels/elementwise_kernels.h"
#include "kernels/host_device_math.h"

namespace weft {

namespace {

template <class T>
T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
}

template <class T>
T gelu_grad(T x) {
  T cdf = T(0.5) * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
  T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
  return cdf + x * pdf;
}

// GELU's tanh form and its exact derivative, PyTorch's formulas (GeluKernel.cpp): with
// u = sqrt(2 / pi) * (x + kappa * x^3) and t = tanh(u),
//   gelu_tanh(x) = 0.5 * x * (1 + t),
//   d/dx         = 0.5 * (1 + t) + 0.5 * x * (1 - t^2) * sqrt(2 / pi) * (1 + 3 * kappa * x^2).
constexpr double kGeluTanhBeta = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;  // sqrt(2 / pi)
constexpr double kGeluTanhKappa = 0.044715;

template <class T>
T gelu_tanh(T x) {
  const T inner = T(kGeluTanhBeta) * (x + T(kGeluTanhKappa) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(inner));
}

template <class T>
T gelu_tanh_grad(T x) {
  const T x2 = x * x;
  const T t = std::tanh(T(kGeluTanhBeta) * (x + T(kGeluTanhKappa) * x2 * x));
  const T inner_grad = T(kGeluTanhBeta) * (T(1) + T(3 * kGeluTanhKappa) * x2);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * inner_grad;
}

template <class T>
T sigmoid(T x) {
  // Split by sign so that exp never overflows.
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  T e = std::exp(x);
  return e / (T(1) + e);
}

// Runs out = f(a, b) over broadcast operands.
template <class T, class R, class F>
void binary_loop(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const int64_t n = out.numel();
  if (a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous() &&
      out.is_contiguous()) {
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    R* po = static_cast<R*>(out.raw_data());
    cpu::parallel_for(0, n, cpu::kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  auto ops = cpu::make_operands<3>(out.shape(), {&out, &a, &b});
  cpu::for_each_run<3>(ops, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t len) {
    if (s[0] == sizeof(R) && s[1] == sizeof(T) && s[2] == 0) {  // tensor op scalar: the common broadcast
      R* o = reinterpret_cast<R*>(p[0]);
      const T* x = reinterpret_cast<const T*>(p[1]);
      const T y = *reinterpret_cast<const T*>(p[2]);
      for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], y);
      return;
    }
    for (int64_t i = 0; i < len; ++i)
      *reinterpret_cast<R*>(p[0] + i * s[0]) =
          f(*reinterpret_cast<const T*>(p[1] + i * s[1]), *reinterpret_cast<const T*>(p[2] + i * s[2]));
  });
}

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
    case BinaryOp::Add: return binary_loop<T, T>(a, b, out, [](T x, T y) { return T(x + y); });
    case BinaryOp::Sub: return binary_loop<T, T>(a, b, out, [](T x, T y) { return T(x - y); });
    case BinaryOp::Mul: return binary_loop<T, T>(a, b, out, [](T x, T y) { return T(x * y); });
    case BinaryOp::Div:
      // Integers: defined for x / 0 and INT_MIN / -1 (Note [Integer division by zero]).
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        return binary_loop<T, T>(a, b, out, [](T x, T y) { return hd::int_div(x, y); });
      else
        return binary_loop<T, T>(a, b, out, [](T x, T y) { return T(x / y); });
    case BinaryOp::Pow: return binary_loop<T, T>(a, b, out, [](T x, T y) { return T(std::pow(x, y)); });
    case BinaryOp::Maximum:
      return binary_loop<T, T>(a, b, out, [](T x, T y) { return (x != x || x > y) ? x : y; });
    case BinaryOp::Minimum:
      return binary_loop<T, T>(a, b, out, [](T x, T y) { return (x != x || x < y) ? x : y; });
    case BinaryOp::Eq: return binary_loop<T, bool>(a, b, out, [](T x, T y) { return x == y; });
    case BinaryOp::Ne: return binary_loop<T, bool>(a, b, out, [](T x, T y) { return x != y; });
    case BinaryOp::Lt: return binary_loop<T, bool>(a, b, out, [](T x, T y) { return x < y; });
    case BinaryOp::Le: return binary_loop<T, bool>(a, b, out, [](T x, T y) { return x <= y; });
    case BinaryOp::Gt: return binary_loop<T, bool>(a, b, out, [](T x, T y) { return x > y; });
    case BinaryOp::Ge: return binary_loop<T, bool>(a, b, out, [](T x, T y) { return x >= y; });
    case BinaryOp::ReluBackward:
      return binary_loop<T, T>(a, b, out, [](T g, T y) { return hd::relu_grad(g, y); });
    case BinaryOp::SigmoidBackward:
      return binary_loop<T, T>(a, b, out, [](T g, T y) { return T(g * y * (T(1) - y)); });
    case BinaryOp::TanhBackward:
      return binary_loop<T, T>(a, b, out, [](T g, T y) { return T(g * (T(1) - y * y)); });
    case BinaryOp::GeluBackward:
      if constexpr (std::is_floating_point_v<T>)
        return binary_loop<T, T>(a, b, out, [](T g, T x) { return g * gelu_grad(x); });
      break;
    case BinaryOp::GeluTanhBackward:
      if constexpr (std::is_floating_point_v<T>)
        return binary_loop<T, T>(a, b, out, [](T g, T x) { return g * gelu_tanh_grad(x); });
      break;
  }
  WEFT_FAIL("binary op ", static_cast<int>(op), " is not defined for dtype ", a.dtype());
}

void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_dtype(a.dtype(), is_comparison(op) ? DTypeSet::All : DTypeSet::Numeric, "binary op",
                 [&](auto tag) { binary_typed<typename decltype(tag)::type>(op, a, b, out); });
}

template <class T, class F>
void unary_loop(const Tensor& in, const Tensor& out, F f) {
  if (in.is_contiguous() && out.is_contiguous()) {
    const T* pi = static_cast<const T*>(in.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    cpu::parallel_for(0, out.numel(), cpu::kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(pi[i]);
    });
    return;
  }
  auto ops = cpu::make_operands<2>(out.shape(), {&out, &in});
  cpu::for_each_run<2>(ops, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t len) {
    for (int64_t i = 0; i < len; ++i)
      *reinterpret_cast<T*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]));
  });
}

template <class T>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out, double p0, double p1) {
  const T c0 = static_cast<T>(p0), c1 = static_cast<T>(p1);
  switch (op) {
    case UnaryOp::Neg: return unary_loop<T>(in, out, [](T x) { return T(-x); });
    case UnaryOp::Abs: return unary_loop<T>(in, out, [](T x) { return x < T(0) ? T(-x) : x; });
    case UnaryOp::Sign: return unary_loop<T>(in, out, [](T x) { return T((T(0) < x) - (x < T(0))); });
    case UnaryOp::Relu: return unary_loop<T>(in, out, [](T x) { return hd::relu(x); });
    case UnaryOp::Affine: return unary_loop<T>(in, out, [c0, c1](T x) { return T(c0 * x + c1); });
    case UnaryOp::Clamp:
      return unary_loop<T>(in, out, [p0, p1](T x) {
        // NaN stays NaN; a missing bound arrives as -inf / +inf.
        double v = static_cast<double>(x);
        return v != v ? x : static_cast<T>(v < p0 ? p0 : (v > p1 ? p1 : v));
      });
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case UnaryOp::Exp: return unary_loop<T>(in, out, [](T x) { return std::exp(x); });
      case UnaryOp::Log: return unary_loop<T>(in, out, [](T x) { return std::log(x); });
      case UnaryOp::Sqrt: return unary_loop<T>(in, out, [](T x) { return std::sqrt(x); });
      case UnaryOp::Sigmoid: return unary_loop<T>(in, out, [](T x) { return sigmoid(x); });
      case UnaryOp::Tanh: return unary_loop<T>(in, out, [](T x) { return std::tanh(x); });
      case UnaryOp::Gelu: return unary_loop<T>(in, out, [](T x) { return gelu(x); });
      case UnaryOp::GeluTanh: return unary_loop<T>(in, out, [](T x) { return gelu_tanh(x); });
      case UnaryOp::PowScalar: return unary_loop<T>(in, out, [c0](T x) { return std::pow(x, c0); });
      default: break;
    }
  }
  (void)c1;
  WEFT_FAIL("unary op ", static_cast<int>(op), " is not defined for dtype ", in.dtype());
}

void unary_kernel(UnaryOp op, const Tensor& in, const Tensor& out, double p0, double p1) {
  dispatch_dtype(in.dtype(), DTypeSet::Numeric, "unary op",
                 [&](auto tag) { unary_typed<typename decltype(tag)::type>(op, in, out, p0, p1); });
}

void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  auto ops = cpu::make_operands<4>(out.shape(), {&out, &cond, &a, &b});
  dispatch_dtype(out.dtype(), DTypeSet::All, "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::for_each_run<4>(ops, [](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t len) {
      for (int64_t i = 0; i < len; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const bool*>(p[1] + i * s[1])
                                                     ? *reinterpret_cast<const T*>(p[2] + i * s[2])
                                                     : *reinterpret_cast<const T*>(p[3] + i * s[3]);
    });
  });
}

}  // namespace

void cpu::register_elementwise_kernels() {
  binary_stub.set(DeviceType::CPU, &binary_kernel);
  unary_stub.set(DeviceType::CPU, &unary_kernel);
  where_stub.set(DeviceType::CPU, &where_kernel);
}

}  // namespace weft
