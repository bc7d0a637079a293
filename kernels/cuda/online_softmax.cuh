// The online softmax state shared by the softmax and cross-entropy kernels (CUDA-only
// header): one pass over a position's values keeps their maximum and the float64 sum of
// exp(value - maximum), rescaling the sum when the maximum grows, so the input is read
// once for both instead of twice.
//
// It reproduces the CPU's two passes (kernels/cpu/softmax_rows.h): exp is taken in the
// input's precision and summed in float64; a NaN value makes the sum NaN; and where the
// CPU meets inf - inf (a +inf value, or only -inf values, make the maximum infinite),
// running_sum gives NaN. Values equal to the running maximum add exactly 1 instead, so the
// pass never forms inf - inf itself and a -inf before the first finite value is harmless.
#pragma once

#include <cuda_runtime.h>

#include <limits>

#include "kernels/cuda/group_reduce.cuh"

namespace weft::cuda {

// exp in the input's precision, as the CPU's softmax takes it.
__device__ __forceinline__ float exp_in(float x) { return ::expf(x); }
__device__ __forceinline__ double exp_in(double x) { return ::exp(x); }

template <class T>
struct RunningSoftmax {
  T max;       // NaN never becomes the maximum
  double sum;  // of exp(value - max) over the values seen
};

template <class T>
__device__ __forceinline__ RunningSoftmax<T> shfl_down(RunningSoftmax<T> v, unsigned delta, int width) {
  return {shfl_down(v.max, delta, width), shfl_down(v.sum, delta, width)};
}

template <class T>
__device__ __forceinline__ RunningSoftmax<T> shfl(RunningSoftmax<T> v, int src_lane, int width) {
  return {shfl(v.max, src_lane, width), shfl(v.sum, src_lane, width)};
}

// No values yet: exp(-inf - x) is 0, so the first finite value replaces it.
template <class T>
__device__ __forceinline__ RunningSoftmax<T> running_identity() {
  return {-std::numeric_limits<T>::infinity(), 0.0};
}

template <class T>
__device__ __forceinline__ RunningSoftmax<T> running_add(RunningSoftmax<T> s, T x) {
  if (x > s.max) {
    s.sum = s.sum * static_cast<double>(exp_in(static_cast<T>(s.max - x))) + 1.0;
    s.max = x;
  } else {
    s.sum += x == s.max ? 1.0 : static_cast<double>(exp_in(static_cast<T>(x - s.max)));
  }
  return s;
}

template <class T>
__device__ __forceinline__ RunningSoftmax<T> running_combine(RunningSoftmax<T> a, RunningSoftmax<T> b) {
  if (b.max > a.max) return {b.max, a.sum * static_cast<double>(exp_in(static_cast<T>(a.max - b.max))) + b.sum};
  if (a.max > b.max) return {a.max, a.sum + b.sum * static_cast<double>(exp_in(static_cast<T>(b.max - a.max)))};
  return {a.max, a.sum + b.sum};
}

// The sum of exp(value - max) as the CPU's two passes give it (see the top of the file).
template <class T>
__device__ __forceinline__ double running_sum(const RunningSoftmax<T>& s) {
  const T inf = std::numeric_limits<T>::infinity();
  return s.max == inf || s.max == -inf ? std::numeric_limits<double>::quiet_NaN() : s.sum;
}

}  // namespace weft::cuda
