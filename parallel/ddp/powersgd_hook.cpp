// PowerSGD: the split of a bucket into compressed and exact gradients, the power-iteration
// step, error feedback and warm start; see powersgd_hook.h.
#include "parallel/ddp/powersgd_hook.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "parallel/process_group/collective_support.h"

namespace weft::parallel {

namespace {

// Makes the columns of `m` (k x r) orthonormal in place, in order (Gram-Schmidt). The norms
// stay on the device (no host read): a zero column is divided by the least positive normal
// number instead of by 0, which leaves it zero.
void orthogonalize(const Tensor& m, double epsilon) {
  const int64_t r = m.shape()[1];
  const double tiny = m.dtype() == DType::Float64   ? std::numeric_limits<double>::min()
                     : m.dtype() == DType::Float16 ? std::ldexp(1.0, -14)
                                                   : static_cast<double>(std::numeric_limits<float>::min());
  for (int64_t i = 0; i < r; ++i) {
    Tensor column = m.narrow(1, i, 1);
    Tensor norm = sqrt(sum(mul(column, column)));
    div_(column, epsilon > 0 ? add(norm, epsilon) : maximum(norm, full_like(norm, tiny)));
    if (i + 1 < r) {
      Tensor rest = m.narrow(1, i + 1, r - i - 1);
      sub_(rest, mul(sum(mul(column, rest), {0}, /*keepdim=*/true), column));
    }
  }
}

}  // namespace

PowerSGDState::PowerSGDState(PowerSGDOptions options) : options_(options), rng_(options.seed) {
  WEFT_CHECK(options_.rank >= 1, "PowerSGDState: rank must be at least 1, got ", options_.rank);
  WEFT_CHECK(options_.min_compression_rate >= 1, "PowerSGDState: min_compression_rate must be at least 1, got ",
             options_.min_compression_rate);
  WEFT_CHECK(options_.orthogonalization_epsilon >= 0, "PowerSGDState: orthogonalization_epsilon must be >= 0, got ",
             options_.orthogonalization_epsilon);
  WEFT_CHECK(options_.start_iteration >= 2 || !(options_.use_error_feedback || options_.warm_start),
             "PowerSGDState: start_iteration must be at least 2 with error feedback or warm start (got ",
             options_.start_iteration, "): DistributedDataParallel rebuilds its buckets after the first iteration, "
             "and this state is kept per bucket");
}

// One bucket's PowerSGD step: what start() prepares and the continuation finishes.
class PowerSGDBucketRun {
 public:
  static std::shared_ptr<Work> start(const std::shared_ptr<PowerSGDState>& state, ProcessGroup& group,
                                     const GradBucket& bucket) {
    NoGradGuard no_grad;
    PowerSGDState& s = *state;
    const bool exact = s.iteration_ < s.options_.start_iteration;
    if (bucket.is_last) ++s.iteration_;
    if (exact) return group.all_reduce(bucket.buffer, ReduceOp::Avg);

    auto run = std::make_shared<PowerSGDBucketRun>();
    run->state_ = state;
    run->group_ = &group;
    run->bucket_ = bucket;
    run->prepare();
    std::shared_ptr<Work> first = run->exact_flat_.defined() ? group.all_reduce(run->exact_flat_, ReduceOp::Sum)
                                                             : group.all_reduce(run->p_memory_, ReduceOp::Sum);
    return then(std::move(first), [run] { run->finish(); });
  }

 private:
  // A gradient sent as factors: its n x m view of the bucket, and views of P and Q.
  struct Factored {
    Tensor matrix, p, q;
  };

  // Error feedback in, the split, the factors' memory, P = M Q.
  void prepare() {
    PowerSGDState& s = *state_;
    const PowerSGDOptions& o = s.options_;
    const Tensor& input = bucket_.buffer;
    const size_t index = bucket_.index;
    if (o.use_error_feedback) {
      auto error = s.error_.find(index);
      if (error != s.error_.end() && error->second.numel() == input.numel()) add_(input, error->second);
      else s.error_[index] = zeros_like(input);
      input_before_ = input.clone();
    }
    std::vector<int64_t> ranks;
    int64_t p_size = 0, q_size = 0;
    for (const Tensor& g : bucket_.gradients) {
      const int64_t n = g.dim() == 0 ? 1 : g.shape()[0], m = n == 0 ? 0 : g.numel() / n;
      const int64_t r = std::min({n, m, o.rank});
      const bool compress = g.dim() >= 2 && static_cast<double>((n + m) * r) * o.min_compression_rate <
                                                static_cast<double>(n * m);
      s.elements_before_ += n * m;
      s.elements_after_ += compress ? (n + m) * r : n * m;
      if (!compress) {
        exact_.push_back(g);
        continue;
      }
      factored_.push_back({g.view({n, m}), Tensor(), Tensor()});
      ranks.push_back(r);
      p_size += n * r;
      q_size += m * r;
    }
    if (!exact_.empty()) exact_flat_ = detail::flatten(exact_);
    if (factored_.empty()) return;

    const TensorOptions options(input.dtype(), input.device());
    const bool fresh = !o.warm_start || !s.p_memory_.count(index) || s.p_memory_[index].numel() != p_size ||
                       s.q_memory_[index].numel() != q_size;
    if (fresh) {
      s.p_memory_[index] = empty({p_size}, options);
      s.q_memory_[index] = empty({q_size}, options);
    }
    p_memory_ = s.p_memory_[index];
    q_memory_ = s.q_memory_[index];
    int64_t p_at = 0, q_at = 0;
    for (size_t k = 0; k < factored_.size(); ++k) {
      Factored& f = factored_[k];
      const int64_t n = f.matrix.shape()[0], m = f.matrix.shape()[1], r = ranks[k];
      f.p = p_memory_.narrow(0, p_at, n * r).view({n, r});
      f.q = q_memory_.narrow(0, q_at, m * r).view({m, r});
      p_at += n * r;
      q_at += m * r;
      // Every rank draws the same Q: one generator, seeded alike, used in the same order.
      if (fresh) f.q.copy_(randn({m, r}, TensorOptions(input.dtype()), &s.rng_));
      orthogonalize(f.q, o.orthogonalization_epsilon);
      f.p.copy_(mm(f.matrix, f.q));
    }
  }

  // Runs once the first all-reduce is done: the exact gradients' average, then P, Q and the
  // approximations, then the error left for the next step.
  void finish() {
    NoGradGuard no_grad;
    PowerSGDState& s = *state_;
    const double world = static_cast<double>(group_->size());
    if (exact_flat_.defined()) {
      div_(exact_flat_, world);
      detail::unflatten_into(exact_flat_, exact_);
      if (!factored_.empty()) group_->all_reduce(p_memory_, ReduceOp::Sum)->wait();
    }
    if (!factored_.empty()) {
      for (const Factored& f : factored_) orthogonalize(f.p, s.options_.orthogonalization_epsilon);
      for (const Factored& f : factored_) f.q.copy_(mm(f.matrix.t(), f.p));
      group_->all_reduce(q_memory_, ReduceOp::Sum)->wait();
      div_(q_memory_, world);
      for (const Factored& f : factored_) f.matrix.copy_(mm(f.p, f.q.t()));
    }
    if (s.options_.use_error_feedback) s.error_[bucket_.index] = sub(input_before_, bucket_.buffer);
    if (!s.options_.warm_start) {
      s.p_memory_.erase(bucket_.index);
      s.q_memory_.erase(bucket_.index);
    }
  }

  std::shared_ptr<PowerSGDState> state_;
  ProcessGroup* group_ = nullptr;
  GradBucket bucket_;
  Tensor input_before_;  // with error feedback: the input, error added, before the exchange
  std::vector<Tensor> exact_;
  Tensor exact_flat_;
  std::vector<Factored> factored_;
  Tensor p_memory_, q_memory_;
};

CommHook powersgd_hook(std::shared_ptr<PowerSGDState> state) {
  WEFT_CHECK(state != nullptr, "powersgd_hook: the state is null");
  return [state](ProcessGroup& group, const GradBucket& bucket) {
    return PowerSGDBucketRun::start(state, group, bucket);
  };
}

}  // namespace weft::parallel
