// Helpers shared by the test suites: fresh random inputs, non-contiguous variants,
// closeness with a stated tolerance, a gradcheck assertion, and scratch file paths.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>

#include <weft.h>

namespace weft::test {

// A fresh random tensor: normal values (uniform in [lo, hi) if lo < hi), from its own
// generator so that every test's inputs are independent of test order.
inline Tensor random(const Shape& shape, DType dtype = DType::Float64, uint64_t seed = 1, double lo = 0,
                     double hi = 0) {
  Generator gen(seed);
  if (lo < hi) return add(mul(rand(shape, dtype, &gen), hi - lo), lo);
  return randn(shape, dtype, &gen);
}

// The same values as t, laid out so that t's view is not contiguous: a transposed copy
// transposed back for 2+ dims, every other element of a doubled buffer for 1 dim.
inline Tensor noncontiguous(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor out;
  if (t.dim() >= 2) {
    out = t.transpose(0, t.dim() - 1).contiguous().transpose(0, t.dim() - 1);
  } else {
    Shape doubled = t.shape();
    if (doubled.empty()) return t.clone();
    doubled[0] *= 2;
    Tensor buffer = zeros(doubled, TensorOptions(t.dtype(), t.device()));
    out = buffer.slice(0, 0, doubled[0], 2);
    out.copy_(t);
  }
  return out.detach();
}

// Max violation of |a - b| <= atol + rtol * |b| (NaN never passes); "" when close.
inline std::string mismatch(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  std::ostringstream out;
  if (actual.shape() != expected.shape()) {
    out << "shape " << actual.shape() << " vs expected " << expected.shape();
    return out.str();
  }
  auto a = actual.detach().to_vector<double>();
  auto e = expected.detach().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - e[i]) <= atol + rtol * std::fabs(e[i]))) {
      out << "element " << i << ": " << a[i] << " vs expected " << e[i] << " (atol " << atol << ", rtol " << rtol
          << ")";
      return out.str();
    }
  }
  return "";
}

// The mismatch is named once: doctest's message is a lambda, and Clang 14 cannot capture a
// structured binding passed as actual or expected.
#define CHECK_CLOSE(actual, expected, atol, rtol)                                            \
  do {                                                                                       \
    const std::string weft_mismatch_ = ::weft::test::mismatch(actual, expected, atol, rtol); \
    CHECK_MESSAGE(weft_mismatch_ == "", weft_mismatch_);                                     \
  } while (0)

#define CHECK_GRADCHECK(fn, inputs)                                   \
  do {                                                                \
    auto result_ = ::weft::gradcheck(fn, inputs);                     \
    CHECK_MESSAGE(result_.ok, result_.message);                       \
  } while (0)

// A float64 leaf that requires grad, with fresh random values.
inline Tensor leaf(const Shape& shape, uint64_t seed, double lo = 0, double hi = 0) {
  return random(shape, DType::Float64, seed, lo, hi).requires_grad_();
}

// cpu:0 ... cpu:(n-1): logical CPU devices for the parallel suites.
inline std::vector<Device> cpu_devices(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.emplace_back(DeviceType::CPU, i);
  return out;
}

// A path in the temporary directory, "<prefix><pid><name>": a suite's files, apart from those of
// the same suite running in another process.
inline std::string scratch_path(const std::string& prefix, const std::string& name) {
  return (std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()) + name)).string();
}

}  // namespace weft::test
