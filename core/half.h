// Half and BFloat16: the two 16-bit floating formats, as values that tensors store.
//
// float16 is IEEE binary16 (5 exponent bits, 10 mantissa bits: 3 decimal digits, largest
// 65504); bfloat16 is float32 cut to its upper half (8 exponent bits, 7 mantissa bits:
// float32's range, 2 decimal digits). weft stores, converts, prints, saves and communicates
// tensors of both, and does not compute with them: what they are for here is halving the
// bytes that cross the wire (DistributedDataParallel's fp16 / bf16 compression hooks) or the
// disk; an op asked to compute with one names the dtype and says to convert first.
//
// Note [Rounding to 16 bits]: a conversion to either format rounds to nearest, ties to
// even, overflows to infinity, turns NaN into a quiet NaN of the same sign, and rounds only
// once: it works on the bits of a double, to which float and every 16-bit value convert
// exactly. (Rounding a double to float first and then to 16 bits can land exactly on a tie
// that the double was not on, and then break it the wrong way.) The code is integer
// arithmetic and single IEEE float operations (nothing a compiler could fuse) in
// WEFT_HOST_DEVICE functions, so the CPU and the GPU give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace weft {

struct Half {
  uint16_t bits;
};

struct BFloat16 {
  uint16_t bits;
};

namespace half_detail {

WEFT_HOST_DEVICE inline uint64_t bits_of(double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

WEFT_HOST_DEVICE inline uint32_t bits_of(float v) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

WEFT_HOST_DEVICE inline float float_of(uint32_t b) {
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}

// The 16 bits of v in a format with kExponent exponent bits and kMantissa mantissa bits.
template <int kExponent, int kMantissa>
WEFT_HOST_DEVICE inline uint16_t round_double(double v) {
  constexpr int kBias = (1 << (kExponent - 1)) - 1;
  constexpr uint32_t kInfinity = ((1u << kExponent) - 1) << kMantissa;
  const uint64_t x = bits_of(v);
  const uint32_t sign = static_cast<uint32_t>(x >> 63) << (kExponent + kMantissa);
  const int exponent = static_cast<int>((x >> 52) & 0x7ff);
  const uint64_t mantissa = x & ((uint64_t{1} << 52) - 1);
  if (exponent == 0x7ff) return static_cast<uint16_t>(sign | kInfinity | (mantissa ? 1u << (kMantissa - 1) : 0u));
  // Zero, and double subnormals (below 2^-1022), are far below half the smallest 16-bit value.
  if (exponent == 0) return static_cast<uint16_t>(sign);
  const int unbiased = exponent - 1023;
  if (unbiased > kBias) return static_cast<uint16_t>(sign | kInfinity);
  // |v| = significand * 2^(unbiased - 52); the target's grid near |v| is spaced 2^quantum
  // (subnormals share the smallest normal's spacing). Keep the significand's bits above
  // the grid, and round on those below it.
  const uint64_t significand = mantissa | (uint64_t{1} << 52);
  const int quantum = (unbiased > 1 - kBias ? unbiased : 1 - kBias) - kMantissa;
  const int shift = quantum - (unbiased - 52);  // > 52 - kMantissa >= 42
  if (shift > 63) return static_cast<uint16_t>(sign);  // far below half the smallest subnormal
  uint64_t kept = significand >> shift;
  const uint64_t rest = significand & ((uint64_t{1} << shift) - 1), tie = uint64_t{1} << (shift - 1);
  if (rest > tie || (rest == tie && (kept & 1))) ++kept;
  // kept * 2^quantum: with kept in [2^m, 2^(m+1)) this is the encoding (biased exponent
  // quantum + m + bias, then the mantissa without its leading 1); a subnormal has kept < 2^m
  // and quantum + m + bias = 1, so it is just kept; a rounding carry into 2^(m+1) moves
  // into the exponent by itself.
  const uint32_t encoded =
      (static_cast<uint32_t>(quantum + kMantissa + kBias - 1) << kMantissa) + static_cast<uint32_t>(kept);
  return static_cast<uint16_t>(sign | (encoded >= kInfinity ? kInfinity : encoded));
}

}  // namespace half_detail

WEFT_HOST_DEVICE inline Half to_half(double v) { return Half{half_detail::round_double<5, 10>(v)}; }
WEFT_HOST_DEVICE inline BFloat16 to_bfloat16(double v) { return BFloat16{half_detail::round_double<8, 7>(v)}; }

// From float, for the loops that convert many values (copies, 16-bit reductions): the same
// bits as from the float's exact value as a double (test_half checks each against the
// other), in a few 32-bit steps.
WEFT_HOST_DEVICE inline Half to_half(float v) {
  const uint32_t x = half_detail::bits_of(v);
  const uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
  // All three candidates, then a choice without branches (the loops vectorise).
  // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits, rounding: adding
  // 0xfff and the kept part's lowest bit carries into it exactly when the dropped bits are
  // above half, or at half with the kept part odd (a carry out of the mantissa raises the
  // exponent, up to infinity).
  const uint32_t normal = (magnitude - (112u << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
  // Below 2^-14, float16's subnormals, multiples of 2^-24: added to 0.5 (whose float
  // spacing is 2^-24) the value is rounded to that grid by the addition itself, to nearest
  // and ties to even, and the sum's low mantissa bits are the multiple.
  const uint32_t subnormal = half_detail::bits_of(half_detail::float_of(magnitude) + 0.5f) - 0x3f000000u;
  // 65536 and beyond: infinity; or NaN.
  const uint32_t beyond = magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t h = magnitude >= 0x47800000u ? beyond : magnitude < 0x38800000u ? subnormal : normal;
  return Half{static_cast<uint16_t>(sign | h)};
}

WEFT_HOST_DEVICE inline BFloat16 to_bfloat16(float v) {
  const uint32_t x = half_detail::bits_of(v);
  if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u)};
  // Drop the low 16 bits, rounding as above; a carry may run into the exponent (the
  // largest floats round to infinity).
  return BFloat16{static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

WEFT_HOST_DEVICE inline float to_float(BFloat16 v) { return half_detail::float_of(uint32_t{v.bits} << 16); }

// Exponent and mantissa moved into float's places, then scaled by 2^(127 - 15): exact for
// normal and subnormal values alike (a float16 subnormal is a float subnormal before the
// scaling; weft never sets flush-to-zero), without branches; infinity and NaN keep an
// exponent of all ones.
WEFT_HOST_DEVICE inline float to_float(Half v) {
  const uint32_t sign = uint32_t{v.bits & 0x8000u} << 16, rest = uint32_t{v.bits & 0x7fffu} << 13;
  const uint32_t finite = half_detail::bits_of(half_detail::float_of(rest) * 0x1p112f);
  return half_detail::float_of(sign | (rest >= 0x0f800000u ? rest | 0x7f800000u : finite));
}

}  // namespace weft
