// CPU multi-tensor kernels for the optimizers and gradient clipping.
//
// All tensors of a call are laid end to end in one index space (FlatIndex), and one
// parallel_for splits that space: a model of many small tensors still fills the
// threads, and a big tensor is shared among them. Every element's update reads and
// writes only that element, so results do not depend on the thread count; the norm
// sums fixed-size blocks and adds the block sums in order, for the same reason.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/parallel.h"
#include "kernels/optim_kernels.h"

namespace weft {

namespace {

// An optimizer update costs a few tens of flops per element (Adam: a sqrt and a
// division), so a parallel region pays off on fewer elements than a plain add.
constexpr int64_t kUpdateGrain = cpu::kGrain / 4;
// Elements per partial sum of the norm: fixed, so that the sum is the same on any
// number of threads.
constexpr int64_t kNormBlock = 8192;

// Where each tensor starts in the concatenated index space of a list.
class FlatIndex {
 public:
  explicit FlatIndex(const TensorList& tensors) {
    offsets_.reserve(tensors.size() + 1);
    offsets_.push_back(0);
    for (const Tensor& t : tensors) offsets_.push_back(offsets_.back() + t.numel());
  }
  int64_t total() const { return offsets_.back(); }

  // body(tensor index, local begin, local end) for each piece of [begin, end) that lies
  // in one tensor, in order.
  template <class F>
  void for_each_piece(int64_t begin, int64_t end, const F& body) const {
    // The last tensor starting at or before `begin` (empty tensors share offsets).
    size_t t = std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin() - 1;
    while (begin < end) {
      int64_t stop = std::min(end, offsets_[t + 1]);
      if (stop > begin) body(t, begin - offsets_[t], stop - offsets_[t]);
      begin = stop;
      ++t;
    }
  }

 private:
  std::vector<int64_t> offsets_;
};

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// PyTorch's lerp: exact at both ends of the weight range.
template <class T>
T lerp(T start, T end, T weight) {
  return std::abs(weight) < T(0.5) ? start + weight * (end - start) : end - (end - start) * (T(1) - weight);
}

template <class T>
void sgd_typed(const TensorList& params, const TensorList& grads, const TensorList& bufs,
               const std::vector<uint8_t>& new_buffer, const SgdHyper& h) {
  const FlatIndex flat(params);
  const T neg_lr = T(-h.lr), momentum = T(h.momentum), keep = T(1 - h.dampening), wd = T(h.weight_decay);
  const bool use_momentum = h.momentum != 0, use_wd = h.weight_decay != 0;
  cpu::parallel_for(0, flat.total(), kUpdateGrain, [&](int64_t begin, int64_t end) {
    flat.for_each_piece(begin, end, [&](size_t t, int64_t lo, int64_t hi) {
      T* p = ptr<T>(params[t]);
      const T* g = ptr<T>(grads[t]);
      T* b = use_momentum ? ptr<T>(bufs[t]) : nullptr;
      const bool fresh = use_momentum && new_buffer[t];
      for (int64_t i = lo; i < hi; ++i) {
        T d = h.maximize ? T(-g[i]) : g[i];
        if (use_wd) d = d + wd * p[i];
        if (use_momentum) {
          b[i] = fresh ? d : T(b[i] * momentum + keep * d);
          d = h.nesterov ? T(d + momentum * b[i]) : b[i];
        }
        p[i] = p[i] + neg_lr * d;
      }
    });
  });
}

void sgd_step_kernel(const TensorList& params, const TensorList& grads, const TensorList& bufs,
                     const std::vector<uint8_t>& new_buffer, const SgdHyper& hyper) {
  if (params.empty()) return;
  dispatch_dtype(params[0].dtype(), DTypeSet::Floating, "SGD.step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) sgd_typed<T>(params, grads, bufs, new_buffer, hyper);
  });
}

template <class T>
void adam_typed(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs, const std::vector<int64_t>& steps,
                const AdamHyper& h) {
  const FlatIndex flat(params);
  // Bias corrections per tensor, in double as PyTorch computes them (Python floats),
  // then rounded to T as its scalar arguments are.
  std::vector<T> neg_step_size(params.size()), bias_correction2_sqrt(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    double step = static_cast<double>(steps[t]);
    neg_step_size[t] = T(-(h.lr / (1 - std::pow(h.beta1, step))));
    bias_correction2_sqrt[t] = T(std::sqrt(1 - std::pow(h.beta2, step)));
  }
  const T weight1 = T(1 - h.beta1), beta2 = T(h.beta2), weight2 = T(1 - h.beta2), eps = T(h.eps);
  const T wd = T(h.weight_decay), decay = T(1 - h.lr * h.weight_decay);
  const bool use_wd = h.weight_decay != 0, decoupled = h.decoupled_weight_decay;
  cpu::parallel_for(0, flat.total(), kUpdateGrain, [&](int64_t begin, int64_t end) {
    flat.for_each_piece(begin, end, [&](size_t t, int64_t lo, int64_t hi) {
      T* p = ptr<T>(params[t]);
      const T* g = ptr<T>(grads[t]);
      T* m = ptr<T>(exp_avgs[t]);
      T* v = ptr<T>(exp_avg_sqs[t]);
      T* v_max = h.amsgrad ? ptr<T>(max_exp_avg_sqs[t]) : nullptr;
      const T step_term = neg_step_size[t], bc2_sqrt = bias_correction2_sqrt[t];
      for (int64_t i = lo; i < hi; ++i) {
        T d = h.maximize ? T(-g[i]) : g[i];
        T x = p[i];
        if (use_wd) {
          if (decoupled)
            x = x * decay;
          else
            d = d + wd * x;
        }
        m[i] = lerp(m[i], d, weight1);
        v[i] = v[i] * beta2 + weight2 * d * d;
        T v_hat = v[i];
        if (v_max) {
          // torch.maximum: NaN propagates from either side.
          T a = v_max[i];
          v_hat = (a != a || a > v_hat) ? a : v_hat;
          v_max[i] = v_hat;
        }
        T denom = std::sqrt(v_hat) / bc2_sqrt + eps;
        p[i] = x + step_term * (m[i] / denom);
      }
    });
  });
}

void adam_step_kernel(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                      const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs,
                      const std::vector<int64_t>& steps, const AdamHyper& hyper) {
  if (params.empty()) return;
  dispatch_dtype(params[0].dtype(), DTypeSet::Floating, "Adam.step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>)
      adam_typed<T>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, hyper);
  });
}

// max with NaN winning, for the inf-norm.
double nan_max(double a, double b) { return (std::isnan(a) || a > b) ? a : b; }

template <class T>
double norm_power_sum_typed(const TensorList& tensors, double norm_type) {
  const FlatIndex flat(tensors);
  const int64_t blocks = (flat.total() + kNormBlock - 1) / kNormBlock;
  const bool is_inf = std::isinf(norm_type);
  std::vector<double> partial(blocks, 0.0);
  auto accumulate = [&](double acc, const T* x, int64_t lo, int64_t hi) {
    if (is_inf) {
      for (int64_t i = lo; i < hi; ++i) acc = nan_max(acc, std::abs(static_cast<double>(x[i])));
    } else if (norm_type == 1) {
      for (int64_t i = lo; i < hi; ++i) acc += std::abs(static_cast<double>(x[i]));
    } else if (norm_type == 2) {
      for (int64_t i = lo; i < hi; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    } else {
      for (int64_t i = lo; i < hi; ++i) acc += std::pow(std::abs(static_cast<double>(x[i])), norm_type);
    }
    return acc;
  };
  cpu::parallel_for(0, blocks, std::max<int64_t>(1, cpu::kGrain / kNormBlock), [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      double acc = 0;
      flat.for_each_piece(blk * kNormBlock, std::min(flat.total(), (blk + 1) * kNormBlock),
                          [&](size_t t, int64_t lo, int64_t hi) { acc = accumulate(acc, ptr<T>(tensors[t]), lo, hi); });
      partial[blk] = acc;
    }
  });
  double total = 0;
  for (double s : partial) total = is_inf ? nan_max(total, s) : total + s;
  return total;
}

double norm_power_sum_kernel(const TensorList& tensors, double norm_type) {
  if (tensors.empty()) return 0;
  return dispatch_dtype(tensors[0].dtype(), DTypeSet::Floating, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) return norm_power_sum_typed<T>(tensors, norm_type);
    return 0.0;
  });
}

void multi_tensor_scale_kernel(const TensorList& tensors, double factor) {
  if (tensors.empty()) return;
  dispatch_dtype(tensors[0].dtype(), DTypeSet::Floating, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      const FlatIndex flat(tensors);
      const T f = T(factor);
      cpu::parallel_for(0, flat.total(), cpu::kGrain, [&](int64_t begin, int64_t end) {
        flat.for_each_piece(begin, end, [&](size_t t, int64_t lo, int64_t hi) {
          T* x = ptr<T>(tensors[t]);
          for (int64_t i = lo; i < hi; ++i) x[i] = x[i] * f;
        });
      });
    }
  });
}

}  // namespace

DispatchStub<SgdStepFn> sgd_step_stub{"SGD.step", &sgd_step_kernel};
DispatchStub<AdamStepFn> adam_step_stub{"Adam.step", &adam_step_kernel};
DispatchStub<NormPowerSumFn> norm_power_sum_stub{"clip_grad_norm_", &norm_power_sum_kernel};
DispatchStub<ScaleFn> multi_tensor_scale_stub{"clip_grad_norm_ (scale)", &multi_tensor_scale_kernel};

}  // namespace weft
