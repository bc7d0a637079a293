// Helpers of the test_cuda_* suites: every CUDA op is checked against the CPU op on the
// same fresh random inputs, with CUDA outputs poisoned (NaN) before kernels write them.
#pragma once

#include <algorithm>
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

// "" when actual and expected have the same shape and dtype, else what differs.
inline std::string layout_difference(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() == expected.shape() && actual.dtype() == expected.dtype()) return "";
  std::ostringstream out;
  out << "shape " << actual.shape() << " " << actual.dtype() << " vs expected " << expected.shape() << " "
      << expected.dtype();
  return out.str();
}

// The first element (values through float64, which holds every dtype weft computes with
// exactly) for which `same(a, e)` is false, described with `asked`; "" when there is none.
template <class Same>
std::string first_difference(const Tensor& actual, const Tensor& expected, Same same, const std::string& asked) {
  if (std::string layout = layout_difference(actual, expected); !layout.empty()) return layout;
  const auto a = actual.detach().to(kCPU).to_vector<double>();
  const auto e = expected.detach().to(kCPU).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same(a[i], e[i])) {
      std::ostringstream out;
      out << "element " << i << ": " << a[i] << " vs expected " << e[i] << " (" << asked << ")";
      return out.str();
    }
  }
  return "";
}

// "" when actual (on any device) equals expected bit for bit (any NaN matching any NaN;
// +0 and -0 differ), else the first difference.
inline std::string bitwise_difference(const Tensor& actual, const Tensor& expected) {
  return first_difference(
      actual, expected,
      [](double a, double e) {
        return (std::isnan(a) && std::isnan(e)) || std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(e);
      },
      "bitwise equality asked");
}

// "" when actual (any device) matches expected: same shape and dtype; NaN exactly where
// expected is NaN; equal infinities; else within atol + rtol * |expected|.
inline std::string difference(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  std::ostringstream asked;
  asked << "atol " << atol << ", rtol " << rtol;
  return first_difference(
      actual, expected,
      [atol, rtol](double a, double e) {
        return std::isnan(e)   ? std::isnan(a)
               : std::isinf(e) ? a == e
                               : std::fabs(a - e) <= atol + rtol * std::fabs(e);
      },
      asked.str());
}

// The largest finite |value| of t (0 for none): the scale of a normalised bound.
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.detach().to(kCPU).to_vector<double>())
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
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
