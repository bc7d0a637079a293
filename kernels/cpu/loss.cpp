// CPU loss kernels (contract: kernels/loss_kernels.h).
//
// Class losses run one position (C values at stride post) per iteration, positions split
// across threads; every position is computed by one thread in a fixed order, and the
// "first bad target" is a minimum over threads, so results do not depend on the thread
// count. cross_entropy makes two passes over a position's logits (max, then sum of exp
// in float64, with the vectorised float exp of kernels/cpu/softmax_rows.h) and keeps
// only lse per position; its backward recomputes softmax from lse in one pass.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/loss_kernels.h"

namespace weft {

namespace {


template <class T>
struct ClassView {
  const int64_t* target;
  const T* weight;  // null: every class weighs 1
  int64_t c, post, ignore_index;

  bool ignored(int64_t t) const { return t == ignore_index; }
  bool valid(int64_t t) const { return t >= 0 && t < c; }
  double weight_of(int64_t k) const { return weight ? static_cast<double>(weight[k]) : 1.0; }
  // Offset of class 0 of position i in the [N, C, post] input.
  int64_t base(int64_t i) const { return (i / post) * c * post + i % post; }
};

template <class T>
ClassView<T> class_view(const Tensor& target, const Tensor& weight, int64_t c, int64_t post, int64_t ignore_index) {
  return {static_cast<const int64_t*>(target.raw_data()),
          weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr, c, post, ignore_index};
}

// Runs body(i) for every position in parallel (each position costs ~c element reads) and
// returns the smallest i for which body returned false, or -1.
template <class Body>
int64_t for_each_position(int64_t positions, int64_t c, const Body& body) {
  std::atomic<int64_t> first_bad{positions};
  cpu::parallel_for(0, positions, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(c, 1)),
                    [&](int64_t begin, int64_t end) {
                      for (int64_t i = begin; i < end; ++i) {
                        if (body(i)) continue;
                        int64_t seen = first_bad.load();
                        while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
                        }
                        break;  // later positions of this chunk cannot be smaller
                      }
                    });
  return first_bad.load() == positions ? -1 : first_bad.load();
}

// --- nll_loss -----------------------------------------------------------------------

template <class T>
int64_t nll_forward(const T* x, const ClassView<T>& v, int64_t positions, T* loss, T* target_weight) {
  return for_each_position(positions, 1, [&](int64_t i) {
    int64_t t = v.target[i];
    bool use = !v.ignored(t) && v.valid(t);
    double w = use ? v.weight_of(t) : 0.0;
    loss[i] = use ? static_cast<T>(-w * x[v.base(i) + t * v.post]) : T(0);
    if (target_weight) target_weight[i] = static_cast<T>(w);
    return v.ignored(t) || v.valid(t);
  });
}

template <class T>
void nll_backward(const T* grad, bool grad_is_scalar, const ClassView<T>& v, int64_t positions, T* grad_in) {
  for_each_position(positions, v.c, [&](int64_t i) {
    T* out = grad_in + v.base(i);
    for (int64_t k = 0; k < v.c; ++k) out[k * v.post] = T(0);
    int64_t t = v.target[i];
    if (!v.ignored(t)) out[t * v.post] = static_cast<T>(-v.weight_of(t) * grad[grad_is_scalar ? 0 : i]);
    return true;
  });
}

// --- cross_entropy ------------------------------------------------------------------

// One position's loss, and its lse. kUnit: the classes are contiguous ([N, C]), so the
// shared vectorised row passes apply; otherwise they sit at stride post.
template <class T, bool kUnit>
double cross_entropy_position(const T* x, int64_t post, int64_t t, const ClassView<T>& v, double smoothing,
                              double weight_total, double& lse) {
  const int64_t c = v.c;
  T m;
  double s, weighted_shift = 0;  // sum exp(x_k - m), sum w_k (x_k - m)
  if constexpr (kUnit) {
    m = cpu::row_max(x, c);
    s = cpu::row_sum_exp<false>(x, c, m, static_cast<T*>(nullptr));
    if (smoothing != 0)
      weighted_shift = cpu::lane_sum(c, [&](int64_t k) { return v.weight_of(k) * static_cast<double>(x[k] - m); });
  } else {
    m = x[0];
    for (int64_t k = 1; k < c; ++k) m = x[k * post] > m ? x[k * post] : m;
    s = 0;
    for (int64_t k = 0; k < c; ++k) s += cpu::exp_fast(static_cast<T>(x[k * post] - m));
    if (smoothing != 0)
      for (int64_t k = 0; k < c; ++k) weighted_shift += v.weight_of(k) * static_cast<double>(x[k * post] - m);
  }
  const int64_t stride = kUnit ? 1 : post;
  double log_s = std::log(s);
  lse = static_cast<double>(m) + log_s;
  double wt = v.weight_of(t);
  double nll = log_s - static_cast<double>(x[t * stride] - m);
  if (smoothing == 0) return wt * nll;
  // sum_k w_k (lse - x_k) = W log_s - sum_k w_k (x_k - m)
  return (1 - smoothing) * wt * nll + smoothing / c * (weight_total * log_s - weighted_shift);
}

// One position's gradient: g * (Q softmax_k - q_k) (loss_kernels.h), written for every k.
template <class T, bool kUnit>
void cross_entropy_backward_position(const T* x, T* out, int64_t post, int64_t t, double g, double lse,
                                     const ClassView<T>& v, double smoothing, double weight_total) {
  const int64_t stride = kUnit ? 1 : post;
  const int64_t c = v.c;
  auto prob = [&](int64_t k) { return static_cast<double>(cpu::exp_fast(static_cast<T>(x[k * stride] - lse))); };
  const double wt = v.weight_of(t);
  if (smoothing == 0) {
    const double scale = g * wt;
    for (int64_t k = 0; k < c; ++k) out[k * stride] = static_cast<T>(scale * prob(k));
    out[t * stride] = static_cast<T>(scale * (prob(t) - 1.0));
    return;
  }
  // sum_k q_k = (1 - ls) w_t + (ls / C) W
  const double total = (1 - smoothing) * wt + smoothing / c * weight_total;
  const double spread = smoothing / c;
  if (v.weight) {
    for (int64_t k = 0; k < c; ++k) out[k * stride] = static_cast<T>(g * (total * prob(k) - spread * v.weight[k]));
  } else {
    for (int64_t k = 0; k < c; ++k) out[k * stride] = static_cast<T>(g * (total * prob(k) - spread));
  }
  out[t * stride] = static_cast<T>(g * (total * prob(t) - spread * wt - (1 - smoothing) * wt));
}

template <class T>
double weight_total(const ClassView<T>& v) {
  double total = 0;
  for (int64_t k = 0; k < v.c; ++k) total += v.weight_of(k);
  return total;
}

template <class T>
int64_t cross_entropy_forward(const T* x, const ClassView<T>& v, int64_t positions, double smoothing, T* loss,
                              T* target_weight, double* lse) {
  const double w_total = smoothing == 0 ? 0.0 : weight_total(v);
  return for_each_position(positions, v.c, [&](int64_t i) {
    int64_t t = v.target[i];
    if (v.ignored(t) || !v.valid(t)) {
      loss[i] = T(0);
      lse[i] = 0;
      if (target_weight) target_weight[i] = T(0);
      return v.ignored(t);
    }
    const T* row = x + v.base(i);
    double value = v.post == 1 ? cross_entropy_position<T, true>(row, 1, t, v, smoothing, w_total, lse[i])
                               : cross_entropy_position<T, false>(row, v.post, t, v, smoothing, w_total, lse[i]);
    loss[i] = static_cast<T>(value);
    if (target_weight) target_weight[i] = static_cast<T>(v.weight_of(t));
    return true;
  });
}

template <class T>
void cross_entropy_backward(const T* grad, bool grad_is_scalar, const T* x, const double* lse, const ClassView<T>& v,
                            int64_t positions, double smoothing, T* grad_in) {
  const double w_total = smoothing == 0 ? 0.0 : weight_total(v);
  for_each_position(positions, v.c, [&](int64_t i) {
    int64_t t = v.target[i];
    T* out = grad_in + v.base(i);
    if (v.ignored(t)) {
      for (int64_t k = 0; k < v.c; ++k) out[k * v.post] = T(0);
      return true;
    }
    const T* row = x + v.base(i);
    double g = grad[grad_is_scalar ? 0 : i];
    if (v.post == 1) cross_entropy_backward_position<T, true>(row, out, 1, t, g, lse[i], v, smoothing, w_total);
    else cross_entropy_backward_position<T, false>(row, out, v.post, t, g, lse[i], v, smoothing, w_total);
    return true;
  });
}

// --- mse_loss -----------------------------------------------------------------------

// Fixed-size blocks summed in parallel and folded in order: deterministic for any thread
// count (the same scheme as the row reductions).
constexpr int64_t kBlock = 8192;

template <class T>
double squared_error_sum(const T* a, const T* b, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partials(blocks);
  cpu::parallel_for(0, blocks, std::max<int64_t>(1, cpu::kGrain / kBlock), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      double lane[8] = {};
      int64_t lo = k * kBlock, hi = std::min(n, lo + kBlock), i = lo;
      for (; i + 8 <= hi; i += 8)
        for (int l = 0; l < 8; ++l) {
          double d = static_cast<double>(a[i + l]) - static_cast<double>(b[i + l]);
          lane[l] += d * d;
        }
      for (int l = 0; i < hi; ++i, ++l) {
        double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        lane[l] += d * d;
      }
      partials[k] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
  });
  double total = 0;
  for (double p : partials) total += p;
  return total;
}

// --- dispatch -----------------------------------------------------------------------

int64_t nll_loss_kernel(const Tensor& log_probs, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                        int64_t post, int64_t ignore_index, const Tensor& loss, const Tensor& target_weight) {
  return dispatch_floating(log_probs.dtype(), "nll_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return nll_forward<T>(static_cast<const T*>(log_probs.raw_data()),
                          class_view<T>(target, weight, c, post, ignore_index), n * post,
                          static_cast<T*>(loss.raw_data()),
                          target_weight.defined() ? static_cast<T*>(target_weight.raw_data()) : nullptr);
  });
}

void nll_loss_backward_kernel(const Tensor& grad, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                              int64_t post, int64_t ignore_index, const Tensor& grad_log_probs) {
  dispatch_floating(grad_log_probs.dtype(), "nll_loss backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    nll_backward<T>(static_cast<const T*>(grad.raw_data()), grad.numel() == 1,
                    class_view<T>(target, weight, c, post, ignore_index), n * post,
                    static_cast<T*>(grad_log_probs.raw_data()));
  });
}

int64_t cross_entropy_kernel(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t n, int64_t c,
                             int64_t post, int64_t ignore_index, double label_smoothing, const Tensor& loss,
                             const Tensor& target_weight, const Tensor& lse) {
  return dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return cross_entropy_forward<T>(static_cast<const T*>(logits.raw_data()),
                                    class_view<T>(target, weight, c, post, ignore_index), n * post, label_smoothing,
                                    static_cast<T*>(loss.raw_data()),
                                    target_weight.defined() ? static_cast<T*>(target_weight.raw_data()) : nullptr,
                                    static_cast<double*>(lse.raw_data()));
  });
}

void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target,
                                   const Tensor& weight, const Tensor& lse, int64_t n, int64_t c, int64_t post,
                                   int64_t ignore_index, double label_smoothing, const Tensor& grad_logits) {
  dispatch_floating(logits.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_backward<T>(static_cast<const T*>(grad.raw_data()), grad.numel() == 1,
                              static_cast<const T*>(logits.raw_data()), static_cast<const double*>(lse.raw_data()),
                              class_view<T>(target, weight, c, post, ignore_index), n * post, label_smoothing,
                              static_cast<T*>(grad_logits.raw_data()));
  });
}

void mse_loss_kernel(const Tensor& input, const Tensor& target, Reduction reduction, const Tensor& out) {
  dispatch_floating(input.dtype(), "mse_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* a = static_cast<const T*>(input.raw_data());
    const T* b = static_cast<const T*>(target.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    const int64_t n = input.numel();
    if (reduction == Reduction::None) {
      cpu::parallel_for(0, n, cpu::kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          T d = a[i] - b[i];
          dst[i] = d * d;
        }
      });
      return;
    }
    double total = squared_error_sum(a, b, n);
    dst[0] = static_cast<T>(reduction == Reduction::Sum ? total : total / static_cast<double>(n));
  });
}

void mse_loss_backward_kernel(const Tensor& grad, const Tensor& input, const Tensor& target, double scale,
                              const Tensor& grad_input, const Tensor& grad_target) {
  dispatch_floating(input.dtype(), "mse_loss backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = static_cast<const T*>(grad.raw_data());
    const T* a = static_cast<const T*>(input.raw_data());
    const T* b = static_cast<const T*>(target.raw_data());
    T* gi = grad_input.defined() ? static_cast<T*>(grad_input.raw_data()) : nullptr;
    T* gt = grad_target.defined() ? static_cast<T*>(grad_target.raw_data()) : nullptr;
    const bool scalar = grad.numel() == 1;
    const T two_scale = static_cast<T>(2 * scale);
    cpu::parallel_for(0, input.numel(), cpu::kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T v = two_scale * (a[i] - b[i]) * g[scalar ? 0 : i];
        if (gi) gi[i] = v;
        if (gt) gt[i] = -v;
      }
    });
  });
}

}  // namespace

void cpu::register_loss_kernels() {
  nll_loss_stub.set(DeviceType::CPU, &nll_loss_kernel);
  nll_loss_backward_stub.set(DeviceType::CPU, &nll_loss_backward_kernel);
  cross_entropy_stub.set(DeviceType::CPU, &cross_entropy_kernel);
  cross_entropy_backward_stub.set(DeviceType::CPU, &cross_entropy_backward_kernel);
  mse_loss_stub.set(DeviceType::CPU, &mse_loss_kernel);
  mse_loss_backward_stub.set(DeviceType::CPU, &mse_loss_backward_kernel);
}

}  // namespace weft
