// CPU softmax / log_softmax, forward and backward (contract: kernels/softmax_kernels.h).
//
// Along the last dim each position is one contiguous row (the shared row passes of
// kernels/cpu/softmax_rows.h). Along an inner dim, kCols neighbouring positions are
// computed side by side, so every pass reads whole cache lines instead of striding
// through memory once per position. Sums accumulate in float64; float32 uses the
// vectorised exp. Each position is computed by one thread in a fixed order
// (deterministic for any thread count).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/softmax_kernels.h"

namespace weft {

namespace {


constexpr int kCols = 64;

using cpu::exp_fast;

// One softmax along a contiguous row of n >= 1 elements.
template <class T, bool kLog>
void softmax_row(const T* x, T* y, int64_t n) {
  const T m = cpu::row_max(x, n);
  if constexpr (kLog) {
    const double log_s = std::log(cpu::row_sum_exp<false>(x, n, m, y));
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<double>(x[i] - m) - log_s);
  } else {
    const double inv = 1.0 / cpu::row_sum_exp<true>(x, n, m, y);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(y[i] * inv);
  }
}

template <class T, bool kLog>
void softmax_backward_row(const T* g, const T* y, T* gx, int64_t n) {
  if constexpr (kLog) {
    const double sum_g = cpu::lane_sum(n, [&](int64_t i) { return static_cast<double>(g[i]); });
    for (int64_t i = 0; i < n; ++i) gx[i] = static_cast<T>(g[i] - exp_fast(y[i]) * sum_g);
  } else {
    const double dot = cpu::lane_sum(n, [&](int64_t i) { return static_cast<double>(g[i]) * y[i]; });
    for (int64_t i = 0; i < n; ++i) gx[i] = static_cast<T>(y[i] * (g[i] - dot));
  }
}

// Softmax of w <= kCols neighbouring positions side by side: element (i, j) at
// x[i * stride + j]. The loops over j vectorise (one accumulator per position).
template <class T, bool kLog>
void softmax_columns(const T* x, T* y, int64_t n, int64_t stride, int w) {
  T m[kCols];
  double s[kCols];
  for (int j = 0; j < w; ++j) m[j] = x[j], s[j] = 0;
  // A NaN never wins the max, but exp(NaN - m) makes the whole position NaN, as in PyTorch.
  for (int64_t i = 1; i < n; ++i) {
    const T* row = x + i * stride;
    for (int j = 0; j < w; ++j) m[j] = row[j] > m[j] ? row[j] : m[j];
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* row = x + i * stride;
    T* out = y + i * stride;
    for (int j = 0; j < w; ++j) {
      T e = exp_fast(static_cast<T>(row[j] - m[j]));
      s[j] += e;
      if constexpr (!kLog) out[j] = e;
    }
  }
  if constexpr (kLog) {
    double log_s[kCols];
    for (int j = 0; j < w; ++j) log_s[j] = std::log(s[j]);
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x + i * stride;
      T* out = y + i * stride;
      for (int j = 0; j < w; ++j) out[j] = static_cast<T>(static_cast<double>(row[j] - m[j]) - log_s[j]);
    }
  } else {
    double inv[kCols];
    for (int j = 0; j < w; ++j) inv[j] = 1.0 / s[j];
    for (int64_t i = 0; i < n; ++i) {
      T* out = y + i * stride;
      for (int j = 0; j < w; ++j) out[j] = static_cast<T>(out[j] * inv[j]);
    }
  }
}

template <class T, bool kLog>
void softmax_backward_columns(const T* g, const T* y, T* gx, int64_t n, int64_t stride, int w) {
  double acc[kCols] = {};
  for (int64_t i = 0; i < n; ++i) {
    const T* gr = g + i * stride;
    const T* yr = y + i * stride;
    for (int j = 0; j < w; ++j) acc[j] += kLog ? static_cast<double>(gr[j]) : static_cast<double>(gr[j]) * yr[j];
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* gr = g + i * stride;
    const T* yr = y + i * stride;
    T* out = gx + i * stride;
    for (int j = 0; j < w; ++j) {
      if constexpr (kLog) out[j] = static_cast<T>(gr[j] - exp_fast(yr[j]) * acc[j]);
      else out[j] = static_cast<T>(yr[j] * (gr[j] - acc[j]));
    }
  }
}

// Calls row(offset) for every row (post == 1) or cols(offset, w) for every block of up to
// kCols neighbouring positions.
template <class Row, class Cols>
void for_each_block(int64_t outer, int64_t n, int64_t post, const Row& row, const Cols& cols) {
  if (post == 1) {
    cpu::parallel_for(0, outer, std::max<int64_t>(1, cpu::kGrain / n), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) row(o * n);
    });
    return;
  }
  const int64_t chunks = (post + kCols - 1) / kCols;
  cpu::parallel_for(0, outer * chunks, std::max<int64_t>(1, cpu::kGrain / (n * kCols)), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      int64_t o = k / chunks, p0 = (k % chunks) * kCols;
      cols(o * n * post + p0, static_cast<int>(std::min<int64_t>(kCols, post - p0)));
    }
  });
}

template <class T, bool kLog>
void softmax_typed(const T* x, T* y, int64_t outer, int64_t n, int64_t post) {
  for_each_block(
      outer, n, post, [&](int64_t off) { softmax_row<T, kLog>(x + off, y + off, n); },
      [&](int64_t off, int w) { softmax_columns<T, kLog>(x + off, y + off, n, post, w); });
}

template <class T, bool kLog>
void softmax_backward_typed(const T* g, const T* y, T* gx, int64_t outer, int64_t n, int64_t post) {
  for_each_block(
      outer, n, post, [&](int64_t off) { softmax_backward_row<T, kLog>(g + off, y + off, gx + off, n); },
      [&](int64_t off, int w) { softmax_backward_columns<T, kLog>(g + off, y + off, gx + off, n, post, w); });
}

void softmax_kernel(const Tensor& in, const Tensor& out, int64_t outer, int64_t n, int64_t post, bool log) {
  dispatch_floating(in.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.raw_data());
    T* y = static_cast<T*>(out.raw_data());
    if (log) softmax_typed<T, true>(x, y, outer, n, post);
    else softmax_typed<T, false>(x, y, outer, n, post);
  });
}

void softmax_backward_kernel(const Tensor& grad, const Tensor& out, const Tensor& grad_in, int64_t outer, int64_t n,
                             int64_t post, bool log) {
  dispatch_floating(out.dtype(), "softmax backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = static_cast<const T*>(grad.raw_data());
    const T* y = static_cast<const T*>(out.raw_data());
    T* gx = static_cast<T*>(grad_in.raw_data());
    if (log) softmax_backward_typed<T, true>(g, y, gx, outer, n, post);
    else softmax_backward_typed<T, false>(g, y, gx, outer, n, post);
  });
}

}  // namespace

void cpu::register_softmax_kernels() {
  softmax_stub.set(DeviceType::CPU, &softmax_kernel);
  softmax_backward_stub.set(DeviceType::CPU, &softmax_backward_kernel);
}

}  // namespace weft
