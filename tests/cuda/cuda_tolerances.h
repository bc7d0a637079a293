// The tolerance tables of the test_cuda_* suites in one place, for the suites that cover
// every op family at once (test_cuda_boundaries, test_cuda_random_shapes). The values are
// the ones the family suites state and justify in their file comments; each entry names
// its source, and nothing here is new. Exact comparisons use CHECK_IDENTICAL
// (cuda_test_util.h): pooling, index ops, copies and the elementwise ops that IEEE
// arithmetic rounds once are bitwise the CPU's.
#pragma once

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "cuda_test_util.h"

namespace weft::test::tolerance {

struct Tol {
  double atol, rtol;
};

// Sums, means and variances over `per_output` elements each (test_cuda_reduce.cpp): the
// GPU sums in another order with the same float64 / int64 accumulators.
inline Tol sums(DType dtype, int64_t per_output) {
  if (dtype == DType::Float32) return {1e-6, 1e-6};
  return {1e-13 * static_cast<double>(std::max<int64_t>(per_output, 1)), 1e-12};
}

// Softmax, losses and their gradients: CUDA's exp against the CPU's (test_cuda_reduce.cpp).
inline Tol math(DType dtype) { return dtype == DType::Float32 ? Tol{1e-6, 1e-5} : Tol{1e-13, 1e-12}; }

// Transcendental pointwise ops (exp, log, tanh, sigmoid, gelu, pow) and their backward
// kernels: CUDA's math library against glibc's (test_cuda_elementwise.cpp).
inline Tol transcendental(DType dtype) { return dtype == DType::Float32 ? Tol{1e-6, 1e-5} : Tol{1e-14, 1e-12}; }

// Optimizer steps: the GPU may contract products into FMAs (test_cuda_index_optim.cpp).
inline Tol optimizer(DType dtype) { return dtype == DType::Float64 ? Tol{1e-14, 1e-12} : Tol{1e-6, 1e-5}; }

// Normalised bounds, |gpu - cpu| <= tol * max|cpu| (test_cuda_nn_ops.cpp): cuBLAS and cuDNN
// block their sums (and cuDNN may transform), batch norm sums its statistics in another order.
inline double matmul_normalised(DType dtype) { return dtype == DType::Float32 ? 2e-5 : 1e-12; }
inline double conv_normalised(DType dtype) { return dtype == DType::Float32 ? 5e-5 : 1e-12; }
inline double batch_norm_normalised(DType dtype) { return dtype == DType::Float32 ? 1e-5 : 1e-12; }

// A gradient that passes through a pointwise backward (math or transcendental) and then a
// sum over broadcast or expanded dims of `per_output` elements: each bound the looser of
// the two tables it combines.
inline Tol combined(Tol a, Tol b) { return {std::max(a.atol, b.atol), std::max(a.rtol, b.rtol)}; }

// |actual - expected| <= tol * max|expected| everywhere (test_cuda_nn_ops.cpp's CHECK_NORMALISED).
inline std::string normalised_difference(const Tensor& actual, const Tensor& expected, double tol) {
  return test::difference(actual, expected, tol * test::max_abs(expected) + 1e-300, 0.0);
}

}  // namespace weft::test::tolerance

// The mismatch is named once, outside doctest's message lambda (Clang 14 cannot capture a
// structured binding there).
#define CHECK_WITHIN(actual, expected, tol)                                                              \
  do {                                                                                                   \
    const ::weft::test::tolerance::Tol weft_tol_ = (tol);                                                \
    const std::string weft_difference_ =                                                                 \
        ::weft::test::difference((actual), (expected), weft_tol_.atol, weft_tol_.rtol);                  \
    CHECK_MESSAGE(weft_difference_.empty(), weft_difference_);                                           \
  } while (0)

#define CHECK_NORMALISED_WITHIN(actual, expected, tol)                                                   \
  do {                                                                                                   \
    const std::string weft_difference_ =                                                                 \
        ::weft::test::tolerance::normalised_difference((actual), (expected), (tol));                     \
    CHECK_MESSAGE(weft_difference_.empty(), weft_difference_);                                           \
  } while (0)
