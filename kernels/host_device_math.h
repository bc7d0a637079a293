// Arithmetic for the formulas that the CPU and CUDA kernels share (WEFT_HOST_DEVICE
// functions): the same overloads on both sides, and multiply-adds whose rounding is
// written down instead of left to the compiler.
//
// Note [Fused multiply-add in shared formulas]: a * b + c may be computed with one
// rounding (a fused multiply-add) or two, and compilers choose on their own: nvcc fuses
// by default, g++ fuses when the target has an FMA instruction (-march=native on any
// recent x86, always on AArch64), and the two do not always fuse the same pairs (in
// v * beta2 + w * g * g either product can be the fused one). Left implicit, the same
// source gives different bits on the CPU and the GPU, and on the CPU under different
// -march flags. So in a shared formula every product that feeds a sum is written as
// mul_add, leaving the compilers nothing to fuse: fused on the GPU and on hosts with an
// FMA instruction, which therefore agree bit for bit; two roundings on a host without
// one (an x86 build without -march=native, where fma() would be a slow library call that
// also stops the loop from vectorising), which is what such a host computed anyway.
// Division and sqrt are correctly rounded on both sides (nvcc's defaults, not
// -use_fast_math), so they need no such care.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "core/half.h"
#include "core/host_device.h"

namespace weft::hd {

// a * b + c: one rounding where the target fuses (Note above), else two.
WEFT_HOST_DEVICE inline float mul_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return ::fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

WEFT_HOST_DEVICE inline double mul_add(double a, double b, double c) {
#if defined(__CUDA_ARCH__) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return ::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// sqrt in the argument's own precision on both sides (std::sqrt is host-only, and the
// global sqrt of the C library has no float overload on the host).
WEFT_HOST_DEVICE inline float sqrt(float x) { return ::sqrtf(x); }
WEFT_HOST_DEVICE inline double sqrt(double x) { return ::sqrt(x); }

// relu and its gradient (from relu's output) with PyTorch's rule for NaN: a NaN stays NaN
// (x <= 0 is false for it), and the gradient at a NaN passes through as threshold_backward
// lets it, so that corruption shows instead of turning into zeros.
template <class T>
WEFT_HOST_DEVICE inline T relu(T x) {
  return x <= T(0) ? T(0) : x;
}
template <class T>
WEFT_HOST_DEVICE inline T relu_grad(T grad, T output) {
  return output <= T(0) ? T(0) : grad;
}

// Note [Integer division by zero]: C++ leaves x / 0 and INT_MIN / -1 undefined; x86
// traps (SIGFPE, the process dies) and the GPU returns whatever its division routine
// makes. weft defines both, the same on every device, as RISC-V does: x / 0 has every bit
// set (-1 for a signed type, the maximum for an unsigned one), and INT_MIN / -1 wraps
// around to INT_MIN. Otherwise the quotient is truncated toward zero, as in C++. (PyTorch
// raises ZeroDivisionError on the CPU and gives undefined values on CUDA.)
template <class T>
WEFT_HOST_DEVICE inline T int_div(T x, T y) {
  static_assert(std::is_integral_v<T>, "int_div takes integers");
  if (y == T(0)) return static_cast<T>(~T(0));
  if constexpr (std::is_signed_v<T>) {
    // -x in unsigned arithmetic, which wraps: INT_MIN / -1 = INT_MIN.
    using U = std::make_unsigned_t<T>;
    if (y == T(-1)) return static_cast<T>(U(0) - static_cast<U>(x));
  }
  return static_cast<T>(x / y);
}

// Note [Converting between dtypes]: C++ leaves a float-to-integer conversion undefined
// when the value is NaN or out of the target's range; x86 answers the "integer indefinite"
// (INT_MIN) or a wrapped byte, the GPU's conversion instructions saturate. weft defines it
// as the GPU does, on every device: truncation toward zero, saturated to the target's range,
// and NaN converts to 0. To bool is "!= 0" (so NaN is true); integer to integer wraps (as
// C++20 defines it, and as PyTorch's casts do).
//
// Half and BFloat16 convert through float (exact from them) and double (exact from float,
// and from every integer up to 2^53): a conversion to them rounds once, ties to even (Note
// [Rounding to 16 bits]); one from them is the float's conversion.
template <class To, class From>
WEFT_HOST_DEVICE inline To convert(From v) {
  if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return convert<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, Half>) {
    if constexpr (std::is_same_v<From, float>) return to_half(v);
    else return to_half(static_cast<double>(v));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    if constexpr (std::is_same_v<From, float>) return to_bfloat16(v);
    else return to_bfloat16(static_cast<double>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    // The bounds as From: the maximum rounds up to a power of two (2^63 for int64 as a
    // double), so everything below it converts exactly.
    constexpr From lowest = static_cast<From>(std::numeric_limits<To>::lowest());
    constexpr From max = static_cast<From>(std::numeric_limits<To>::max());
    if (!(v == v)) return To(0);
    if (v <= lowest) return std::numeric_limits<To>::lowest();
    if (v >= max) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace weft::hd
