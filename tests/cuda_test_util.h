// Helpers of the test_cuda_* suites: every CUDA op is checked against the CPU op on the
// same fresh random inputs, with CUDA outputs poisoned (NaN) before kernels write them.
#pragma once

#include <bit>
#include <cmath>
#include <sstream>
#include <string>

#include "test_util.h"

namespace weft::test {

inline Device gpu(int index = 0) { return Device::cuda(index); }

// The same values on the GPU, as a leaf (requires_grad as asked) or a plain tensor.
inline Tensor on_gpu(const Tensor& t, bool requires_grad = false) {
  Tensor out = t.detach().to(gpu());
  if (requires_grad) out.requires_grad_();
  return out;
}

// A tensor full of NaN (or of the dtype's largest value for integers), for outputs a
// kernel must overwrite completely.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  double poison = is_floating(dtype) ? std::nan("") : (dtype == DType::Bool ? 1.0 : 77.0);
  return full(shape, poison, TensorOptions(dtype, device));
}

// "" when actual (on any device) equals expected bit for bit (any NaN matching any NaN;
// +0 and -0 differ), else the first difference. Values pass through float64, which holds
// every dtype weft computes with exactly.
inline std::string bitwise_difference(const Tensor& actual, const Tensor& expected) {
  std::ostringstream out;
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype()) {
    out << "shape " << actual.shape() << " " << actual.dtype() << " vs expected " << expected.shape() << " "
        << expected.dtype();
    return out.str();
  }
  const auto a = actual.detach().to(kCPU).to_vector<double>();
  const auto e = expected.detach().to(kCPU).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same =
        (std::isnan(a[i]) && std::isnan(e[i])) || std::bit_cast<uint64_t>(a[i]) == std::bit_cast<uint64_t>(e[i]);
    if (!same) {
      out << "element " << i << ": " << a[i] << " vs expected " << e[i] << " (bitwise equality asked)";
      return out.str();
    }
  }
  return "";
}

#define CHECK_IDENTICAL(actual, expected)                                                     \
  do {                                                                                        \
    const std::string weft_difference_ = ::weft::test::bitwise_difference((actual), (expected)); \
    CHECK_MESSAGE(weft_difference_.empty(), weft_difference_);                                \
  } while (0)

// CUDA result vs CPU reference: same shape, values within atol + rtol * |ref|.
#define CHECK_GPU_MATCHES(gpu_tensor, cpu_tensor, atol, rtol)                                    \
  do {                                                                                          \
    std::string weft_mismatch_ = ::weft::test::mismatch((gpu_tensor).to(::weft::kCPU), (cpu_tensor), (atol), (rtol)); \
    CHECK_MESSAGE(weft_mismatch_.empty(), weft_mismatch_);                                      \
  } while (0)

}  // namespace weft::test
