// CPU layer normalisation kernels (contract: kernels/layer_norm_kernels.h).
//
// Forward: rows in parallel, each row by one thread in three passes over its n values (the
// sum, the squares about the mean, the write); the row stays in cache between them. Sums
// are float64 in kRowLanes lanes (kernels/cpu/softmax_rows.h), so each row's result is one
// fixed function of the row.
//
// Backward: grad_x is per row like the forward. grad_weight and grad_bias are column sums
// over all rows, and to keep them independent of the thread count the rows are cut into
// blocks by the shape alone (at most kMaxRowBlocks): a task takes whole blocks, and for
// each of its rows writes grad_x and adds grad_y * xhat and grad_y into its block's own
// float64 column partials (a few passes over each row, which stays in cache); then each column
// adds its blocks' partials in block order. Everything after the sums is
// kernels/layer_norm_math.h, shared with the CUDA kernels.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/layer_norm_kernels.h"
#include "kernels/layer_norm_math.h"

namespace weft {

namespace {

// Enough blocks for the threads of a large host; few enough that the partials (two
// float64 rows of n per block) stay small next to the tensors.
constexpr int64_t kMaxRowBlocks = 64;

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <class T>
T* mutable_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// f(has_weight, has_bias) with each flag as a std::bool_constant, so that the row loops
// are compiled without a per-element test.
template <class F>
void with_affine(bool weight, bool bias, const F& f) {
  if (weight && bias) f(std::true_type{}, std::true_type{});
  else if (weight) f(std::true_type{}, std::false_type{});
  else if (bias) f(std::false_type{}, std::true_type{});
  else f(std::false_type{}, std::false_type{});
}

template <class T, bool kWeight, bool kBias>
void forward_row(const T* x, const T* w, const T* b, T* y, T& mean, T& rstd, int64_t n, double eps) {
  const double count = static_cast<double>(n);
  const double m = cpu::lane_sum(n, [x](int64_t i) { return static_cast<double>(x[i]); }) / count;
  const double sum_sq = cpu::lane_sum(n, [x, m](int64_t i) {
    const double d = static_cast<double>(x[i]) - m;
    return d * d;
  });
  const T mt = static_cast<T>(m), rt = static_cast<T>(layer_norm_rstd(sum_sq, count, eps));
  mean = mt;
  rstd = rt;
  for (int64_t i = 0; i < n; ++i) y[i] = layer_norm_apply<T>(x[i], mt, rt, kWeight ? w[i] : T(1), kBias ? b[i] : T(0));
}

template <class T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* px = x.data_ptr<T>();
  const T *pw = data_or_null<T>(weight), *pb = data_or_null<T>(bias);
  T* py = y.data_ptr<T>();
  T *pm = mean.data_ptr<T>(), *pr = rstd.data_ptr<T>();
  with_affine(pw != nullptr, pb != nullptr, [&](auto has_weight, auto has_bias) {
    constexpr bool kWeight = decltype(has_weight)::value, kBias = decltype(has_bias)::value;
    cpu::parallel_for(0, rows, std::max<int64_t>(1, cpu::kGrain / n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        forward_row<T, kWeight, kBias>(px + r * n, pw, pb, py + r * n, pm[r], pr[r], n, eps);
    });
  });
}

// One row of the backward: grad_x (when gx is not null), and the row's terms added into
// the column partials part_w (grad_y * xhat) and part_b (grad_y) when those are not null.
template <class T, bool kWeight>
void backward_row(const T* g, const T* x, T mean, T rstd, const T* w, T* gx, double* part_w, double* part_b,
                  int64_t n) {
  const double mu = mean, rs = rstd;
  auto xhat = [x, mu, rs](int64_t i) { return layer_norm_xhat(static_cast<double>(x[i]), mu, rs); };
  auto dy = [g, w](int64_t i) {
    const double gi = static_cast<double>(g[i]);
    return kWeight ? gi * static_cast<double>(w[i]) : gi;
  };
  if (gx != nullptr) {
    // Two passes over the row (it stays in cache): a loop with one sum vectorises, one with two does not.
    const double sum_dy = cpu::lane_sum(n, dy);
    const double sum_dy_xhat = cpu::lane_sum(n, [&](int64_t i) { return dy(i) * xhat(i); });
    const LayerNormInputGrad grad_of(rs, sum_dy, sum_dy_xhat, static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) gx[i] = static_cast<T>(grad_of(dy(i), xhat(i)));
  }
  if (part_w != nullptr)
    for (int64_t i = 0; i < n; ++i) part_w[i] = hd::mul_add(static_cast<double>(g[i]), xhat(i), part_w[i]);
  if (part_b != nullptr)
    for (int64_t i = 0; i < n; ++i) part_b[i] += static_cast<double>(g[i]);
}

template <class T, bool kWeight>
void backward_typed(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T *g = grad_y.data_ptr<T>(), *px = x.data_ptr<T>(), *w = data_or_null<T>(weight);
  const T *pm = mean.data_ptr<T>(), *pr = rstd.data_ptr<T>();
  T* gx = mutable_or_null<T>(grad_x);
  const bool need_w = grad_weight.defined(), need_b = grad_bias.defined();

  // The blocks depend on rows alone: every column's sums run in one order for any thread count.
  const int64_t per_block = (rows + kMaxRowBlocks - 1) / kMaxRowBlocks;
  const int64_t blocks = (rows + per_block - 1) / per_block;
  std::vector<double> part_w(need_w ? blocks * n : 0), part_b(need_b ? blocks * n : 0);
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / (per_block * n));
  cpu::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      double* pw = need_w ? part_w.data() + k * n : nullptr;
      double* pb = need_b ? part_b.data() + k * n : nullptr;
      for (int64_t r = k * per_block; r < std::min(rows, (k + 1) * per_block); ++r)
        backward_row<T, kWeight>(g + r * n, px + r * n, pm[r], pr[r], w, gx ? gx + r * n : nullptr, pw, pb, n);
    }
  });
  if (!need_w && !need_b) return;

  // Each column adds its blocks' partials in block order; a task takes a run of columns.
  T *gw = mutable_or_null<T>(grad_weight), *gb = mutable_or_null<T>(grad_bias);
  cpu::parallel_for(0, n, std::max<int64_t>(1, cpu::kGrain / blocks), [&](int64_t begin, int64_t end) {
    std::vector<double> acc_w(need_w ? end - begin : 0), acc_b(need_b ? end - begin : 0);
    for (int64_t k = 0; k < blocks; ++k) {
      if (need_w)
        for (int64_t c = begin; c < end; ++c) acc_w[c - begin] += part_w[k * n + c];
      if (need_b)
        for (int64_t c = begin; c < end; ++c) acc_b[c - begin] += part_b[k * n + c];
    }
    for (int64_t c = begin; c < end; ++c) {
      if (need_w) gw[c] = static_cast<T>(acc_w[c - begin]);
      if (need_b) gb[c] = static_cast<T>(acc_b[c - begin]);
    }
  });
}

void forward_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                    const Tensor& mean, const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(x, weight, bias, eps, y, mean, rstd);
  });
}

void backward_kernel(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                     const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "layer_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (weight.defined()) backward_typed<T, true>(grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias);
    else backward_typed<T, false>(grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias);
  });
}

}  // namespace

void cpu::register_layer_norm_kernels() {
  layer_norm_forward_stub.set(DeviceType::CPU, &forward_kernel);
  layer_norm_backward_stub.set(DeviceType::CPU, &backward_kernel);
}

}  // namespace weft
