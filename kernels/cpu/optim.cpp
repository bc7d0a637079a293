// CPU multi-tensor kernels for the optimizers and gradient clipping.
//
// All tensors of a call are laid end to end in one index space (FlatIndex), and one
// parallel_for splits that space: a model of many small tensors still fills the
// threads, and a big tensor is shared among them. Every element's update reads and
// writes only that element, so results do not depend on the thread count; the norm
// sums fixed-size blocks and adds the block sums in order, for the same reason. What one
// element's step computes is kernels/optim_updates.h, shared with the CUDA kernels.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/optim_kernels.h"
#include "kernels/optim_updates.h"

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

template <class T>
void sgd_typed(const TensorList& params, const TensorList& grads, const TensorList& bufs,
               const std::vector<uint8_t>& new_buffer, const SgdHyper& h) {
  const FlatIndex flat(params);
  const SgdRule<T> rule = SgdRule<T>::from(h);
  cpu::parallel_for(0, flat.total(), kUpdateGrain, [&](int64_t begin, int64_t end) {
    flat.for_each_piece(begin, end, [&](size_t t, int64_t lo, int64_t hi) {
      const SgdRule<T> r = rule;  // a local copy: no store to the tensors can change it
      T* p = ptr<T>(params[t]);
      const T* g = ptr<T>(grads[t]);
      T* b = r.use_momentum ? ptr<T>(bufs[t]) : nullptr;
      const bool fresh = r.use_momentum && new_buffer[t];
      for (int64_t i = lo; i < hi; ++i) r.step(p, g, b, fresh, i);
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
  // Bias corrections per tensor, rounded to T as PyTorch's scalar arguments are.
  std::vector<T> neg_step_size(params.size()), bias_correction2_sqrt(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    const AdamStepScalars s = AdamStepScalars::at(h, steps[t]);
    neg_step_size[t] = T(s.neg_step_size);
    bias_correction2_sqrt[t] = T(s.bias_correction2_sqrt);
  }
  const AdamRule<T> rule = AdamRule<T>::from(h);
  cpu::parallel_for(0, flat.total(), kUpdateGrain, [&](int64_t begin, int64_t end) {
    flat.for_each_piece(begin, end, [&](size_t t, int64_t lo, int64_t hi) {
      const AdamRule<T> r = rule;  // a local copy: no store to the tensors can change it
      T* p = ptr<T>(params[t]);
      const T* g = ptr<T>(grads[t]);
      T* m = ptr<T>(exp_avgs[t]);
      T* v = ptr<T>(exp_avg_sqs[t]);
      T* v_max = r.amsgrad ? ptr<T>(max_exp_avg_sqs[t]) : nullptr;
      const T step_term = neg_step_size[t], bc2_sqrt = bias_correction2_sqrt[t];
      for (int64_t i = lo; i < hi; ++i) r.step(p, g, m, v, v_max, i, step_term, bc2_sqrt);
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

void norm_power_sum_kernel(const TensorList& tensors, double norm_type, const Tensor& out) {
  double total = 0;
  if (!tensors.empty())
    total = dispatch_dtype(tensors[0].dtype(), DTypeSet::Floating, "clip_grad_norm_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) return norm_power_sum_typed<T>(tensors, norm_type);
      return 0.0;
    });
  *out.data_ptr<double>() = total;
}

void clip_scale_kernel(const TensorList& tensors, const Tensor& total_norm, double max_norm) {
  const double coef = clip_coefficient(*total_norm.data_ptr<double>(), max_norm);
  if (tensors.empty() || coef >= 1) return;  // a NaN factor is applied (clip_coefficient)
  dispatch_dtype(tensors[0].dtype(), DTypeSet::Floating, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      const FlatIndex flat(tensors);
      const T f = T(coef);
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

void cpu::register_optim_kernels() {
  sgd_step_stub.set(DeviceType::CPU, &sgd_step_kernel);
  adam_step_stub.set(DeviceType::CPU, &adam_step_kernel);
  norm_power_sum_stub.set(DeviceType::CPU, &norm_power_sum_kernel);
  clip_scale_stub.set(DeviceType::CPU, &clip_scale_kernel);
}

}  // namespace weft
