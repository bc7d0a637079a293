// The row passes that softmax, log_softmax and cross_entropy share on the CPU: the row
// maximum, and the sum of exp(x - max), with a float exp that vectorises.
//
// std::exp is a library call per element (about 5 ns here); softmax spends nearly all
// its time in it. exp_float below is branch-free arithmetic the compiler vectorises, within
// 2 ulp of the exact value for every float (tests/kernels/test_softmax_loss.cpp checks it against
// std::exp in float64). float64 keeps std::exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace weft::cpu {

// A float's bits as an int32 that orders like the float (and back: the map is its own
// inverse). Clamping in this domain is an integer min / max: the compiler keeps it
// branch-free, where a float compare-and-select would become a branch (float compares may
// trap) and stop the loop from vectorising.
constexpr int32_t ordered_bits(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }

// exp(x) = 2^k * exp(r) with k the integer nearest x / ln 2 and |r| <= ln 2 / 2; exp(r) by
// its Taylor series to degree 7 (truncation error below 2e-9, relative). NaN propagates;
// large x gives inf, small x gives subnormals, then 0.
inline float exp_float(float in) {
  // Clamped to [-104, 89] so that k stays small: exp(-104) is below half the smallest
  // subnormal, exp(89) overflows to inf.
  constexpr int32_t kLo = ordered_bits(std::bit_cast<int32_t>(-104.0f));
  constexpr int32_t kHi = ordered_bits(std::bit_cast<int32_t>(89.0f));
  const int32_t bits = std::bit_cast<int32_t>(in);
  int32_t key = ordered_bits(bits);
  key = key < kLo ? kLo : key;
  key = key > kHi ? kHi : key;
  const float x = std::bit_cast<float>(ordered_bits(key));
  // k rounded to nearest by the 1.5 * 2^23 trick (|x / ln 2| < 2^22).
  const float shifter = 12582912.0f;
  const float k = (x * 1.44269504088896341f + shifter) - shifter;
  // r = x - k ln 2 with ln 2 split in two: k * kLn2Hi is exact (k has 8 bits, kLn2Hi 16).
  const float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723212e-6f;
  const float r = (x - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^k as two factors, so that k in [-150, 128] needs no exponent outside [-75, 64].
  const int32_t ki = static_cast<int32_t>(k);
  const int32_t k1 = ki >> 1, k2 = ki - k1;
  const float result = p * std::bit_cast<float>((k1 + 127) << 23) * std::bit_cast<float>((k2 + 127) << 23);
  // A NaN input (clamped to a number above) is given back, by masks rather than a select.
  const int32_t nan = -static_cast<int32_t>((bits & 0x7fffffff) > 0x7f800000);
  return std::bit_cast<float>((bits & nan) | (std::bit_cast<int32_t>(result) & ~nan));
}

inline float exp_fast(float x) { return exp_float(x); }
inline double exp_fast(double x) { return std::exp(x); }

constexpr int kRowLanes = 8;

// Largest of x[0], ..., x[n - 1] (n >= 1), ignoring NaN (a NaN in the row still makes
// every exp(x - max) that meets it NaN).
template <class T>
T row_max(const T* x, int64_t n) {
  T lane[kRowLanes];
  for (int l = 0; l < kRowLanes; ++l) lane[l] = x[0];
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
    for (int l = 0; l < kRowLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  for (; i < n; ++i) lane[0] = x[i] > lane[0] ? x[i] : lane[0];
  T m = lane[0];
  for (int l = 1; l < kRowLanes; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
}

// The sum of f(0), ..., f(n - 1) (doubles) in kRowLanes float64 lanes: a fixed order,
// and a loop the compiler vectorises when f is simple.
template <class F>
double lane_sum(int64_t n, const F& f) {
  double lane[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
    for (int l = 0; l < kRowLanes; ++l) lane[l] += f(i + l);
  for (int l = 0; i < n; ++i, ++l) lane[l] += f(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The sum of exp(x[i] - m); with kStore, also writes each exp(x[i] - m) to y[i].
template <bool kStore, class T>
double row_sum_exp(const T* x, int64_t n, T m, T* y) {
  return lane_sum(n, [&](int64_t i) {
    T e = exp_fast(static_cast<T>(x[i] - m));
    if constexpr (kStore) y[i] = e;
    return static_cast<double>(e);
  });
}

}  // namespace weft::cpu
