// Kernel signatures of the elementwise family, shared by the CPU and CUDA backends.
//
// Arguments arrive checked: inputs broadcast to out's shape, share one dtype (out's,
// except comparisons, whose out is bool), and live on out's device.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

enum class BinaryOp {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge,  // out is bool
  // Fused backward kernels: (grad, saved) -> grad_in.
  ReluBackward,     // saved = relu output: g * (y > 0)
  SigmoidBackward,  // saved = sigmoid output: g * y * (1 - y)
  TanhBackward,     // saved = tanh output: g * (1 - y^2)
  GeluBackward,     // saved = input x: g * d/dx gelu(x)
  GeluTanhBackward, // saved = input x: g * d/dx gelu_tanh(x)
};

enum class UnaryOp {
  Neg, Exp, Log, Sqrt, Abs, Sign, Relu, Sigmoid, Tanh, Gelu,
  GeluTanh,   // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
  Affine,     // p0 * x + p1
  PowScalar,  // x ^ p0
  Clamp,      // min(max(x, p0), p1)
};

constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq && op <= BinaryOp::Ge; }

using BinaryFn = void(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
using UnaryFn = void(UnaryOp op, const Tensor& in, const Tensor& out, double p0, double p1);
using WhereFn = void(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);

extern DispatchStub<BinaryFn> binary_stub;
extern DispatchStub<UnaryFn> unary_stub;
extern DispatchStub<WhereFn> where_stub;

}  // namespace weft
