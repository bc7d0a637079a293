// Philox words -> values: the uniform, normal and integer transforms of random fills.
//
// Shared by kernels/cpu/random.cpp and kernels/cuda/random.cu, so that one generator
// state gives the same tensor on either device (core/generator.h). Each function makes
// one element from its own words (1, 2 or 4 of them, random_words_per_element in
// kernels/random_kernels.h) and nothing else, so an element's value depends on its index
// alone. Everything runs in double and is rounded to T once at the end. Integers and
// uniforms are exact functions of the words and equal on both devices bit for bit;
// normals go through log and cos, whose host and CUDA versions may differ by an ulp of
// the double, which the rounding to float32 almost always hides.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "kernels/host_device_math.h"

namespace weft {

// (0, 1] from 32 bits and from 64 bits (53 of them); never 0, so log() is safe.
WEFT_HOST_DEVICE inline double unit_open_low_32(uint32_t x) { return (static_cast<double>(x) + 1.0) * 0x1p-32; }
WEFT_HOST_DEVICE inline double unit_open_low_64(uint32_t hi, uint32_t lo) {
  return (static_cast<double>((uint64_t{hi} << 21) ^ (lo >> 11)) + 1.0) * 0x1p-53;
}

// Uniform in [a, b) from w[0] (24 bits) or, for double, w[0..1] (53 bits).
template <class T>
WEFT_HOST_DEVICE inline T random_uniform(const uint32_t* w, double a, double b) {
  // [0, 1); (k + 1) * 2^-53 - 2^-53 is exact (k < 2^53), fused or not.
  const double unit = std::is_same_v<T, double> ? unit_open_low_64(w[0], w[1]) - 0x1p-53
                                                 : static_cast<double>(w[0] >> 8) * 0x1p-24;
  return static_cast<T>(hd::mul_add(b - a, unit, a));
}

// Normal with the given mean and standard deviation from w[0..1] (32-bit uniforms) or,
// for double, w[0..3] (53-bit ones): Box-Muller, cosine branch only, so that element i
// is a function of its own words.
template <class T>
WEFT_HOST_DEVICE inline T random_normal(const uint32_t* w, double mean, double stddev) {
  constexpr double kTwoPi = 0x1.921fb54442d18p+2;  // 2 * pi rounded to double
  constexpr bool kWide = std::is_same_v<T, double>;
  const double u1 = kWide ? unit_open_low_64(w[0], w[1]) : unit_open_low_32(w[0]);
  const double u2 = kWide ? unit_open_low_64(w[2], w[3]) : unit_open_low_32(w[1]);
  const double radius = hd::sqrt(-2.0 * ::log(u1));
  return static_cast<T>(hd::mul_add(stddev * radius, ::cos(kTwoPi * u2), mean));
}

// Integer in [low, high) from w[0..1]: 64 bits modulo the range (the bias is below
// range / 2^64).
template <class T>
WEFT_HOST_DEVICE inline T random_integer(const uint32_t* w, double low, double high) {
  const uint64_t bits = (uint64_t{w[0]} << 32) | w[1];
  const auto first = static_cast<int64_t>(low);
  const auto range = static_cast<uint64_t>(static_cast<int64_t>(high) - first);
  return static_cast<T>(first + static_cast<int64_t>(bits % range));
}

}  // namespace weft
