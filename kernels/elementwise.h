// Elementwise ops with NumPy broadcasting, their in-place variants and operators.
//
// Dtype rules (simpler than PyTorch's promotion, and said in the error when broken):
// both tensor operands share one dtype; a scalar takes the tensor's dtype and must be
// integral for an integer tensor; div, pow and the transcendental ops need float32 or
// float64; comparisons return bool; where takes a bool condition.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace weft {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);  // not differentiable (zero gradient almost everywhere)
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
// GELU, as torch.nn.functional.gelu: None is the exact form x * Phi(x) (Phi the normal CDF,
// through erf), PyTorch's default; Tanh is its approximate='tanh',
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), which GPT-2 was trained with.
enum class GeluApproximate { None, Tanh };
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::None);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// cond ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// In place (PyTorch's C++ convention: a Tensor is a handle, so self is const& and its
// values change): self keeps its shape (other must broadcast to it). Under autograd, a leaf
// that requires grad or a view cannot be modified (see check_inplace).
const Tensor& add_(const Tensor& self, const Tensor& other);
const Tensor& sub_(const Tensor& self, const Tensor& other);
const Tensor& mul_(const Tensor& self, const Tensor& other);
const Tensor& div_(const Tensor& self, const Tensor& other);
const Tensor& add_(const Tensor& self, double other);
const Tensor& sub_(const Tensor& self, double other);
const Tensor& mul_(const Tensor& self, double other);
const Tensor& div_(const Tensor& self, double other);
const Tensor& neg_(const Tensor& self);
const Tensor& exp_(const Tensor& self);
const Tensor& log_(const Tensor& self);
const Tensor& sqrt_(const Tensor& self);
const Tensor& abs_(const Tensor& self);
const Tensor& relu_(const Tensor& self);
const Tensor& sigmoid_(const Tensor& self);
const Tensor& tanh_(const Tensor& self);
const Tensor& pow_(const Tensor& self, double exponent);
const Tensor& clamp_(const Tensor& self, std::optional<double> min, std::optional<double> max);
const Tensor& fill_(const Tensor& self, double value);
const Tensor& zero_(const Tensor& self);

// Fused backward helpers, shared with the layers that use these activations.
Tensor relu_backward(const Tensor& grad, const Tensor& output);
Tensor sigmoid_backward(const Tensor& grad, const Tensor& output);
Tensor tanh_backward(const Tensor& grad, const Tensor& output);
// grad * d/dx gelu(x) of the form `approximate` (the exact derivative of that form).
Tensor gelu_backward(const Tensor& grad, const Tensor& input, GeluApproximate approximate = GeluApproximate::None);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return mul(pow(b, -1.0), a); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline const Tensor& operator+=(const Tensor& a, const Tensor& b) { return add_(a, b); }
inline const Tensor& operator-=(const Tensor& a, const Tensor& b) { return sub_(a, b); }
inline const Tensor& operator*=(const Tensor& a, const Tensor& b) { return mul_(a, b); }
inline const Tensor& operator/=(const Tensor& a, const Tensor& b) { return div_(a, b); }
inline const Tensor& operator+=(const Tensor& a, double b) { return add_(a, b); }
inline const Tensor& operator-=(const Tensor& a, double b) { return sub_(a, b); }
inline const Tensor& operator*=(const Tensor& a, double b) { return mul_(a, b); }
inline const Tensor& operator/=(const Tensor& a, double b) { return div_(a, b); }

}  // namespace weft
