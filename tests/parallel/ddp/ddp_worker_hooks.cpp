// ddp_worker's communication-hook scenarios (see ddp_worker.cpp): DDP with the
// allreduce, fp16 or bf16 hook of parallel/ddp/comm_hooks.h, or PowerSGD's
// (parallel/ddp/powersgd_hook.h), against the ranks' own gradients, transformed as the hook
// transforms them, and against one process training on the whole batch.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "ddp_worker_util.h"
#include "parallel/ddp/comm_hook_registry.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/ddp/powersgd_hook.h"
#include "parallel/process_group/distributed.h"

namespace weft::ddp_worker {

namespace {

using namespace weft::parallel;

// Note [What a compression hook may give]: with world ranks, rank r's gradient g_r is
// divided by world, rounded to the wire format (unit roundoff u), and the ranks' values are
// summed in that format, each partial sum rounded to it. The result is a value of the
// format; at two ranks it is round(c_0 + c_1) exactly (one addition, and addition
// commutes), and beyond, the order of the additions is the backend's, so it is within the
// accumulated roundings of the exact average: world * u * sum_r |g_r / world| (relative
// errors) plus world * tiny (half the smallest subnormal, for values that underflow).
struct Wire {
  DType dtype;
  double unit_roundoff, tiny;
  double round(double v) const {
    return dtype == DType::Float16 ? to_float(to_half(v)) : to_float(to_bfloat16(v));
  }
};

Wire wire_of(const std::string& hook) {
  if (hook == "fp16") return {DType::Float16, std::ldexp(1.0, -11), std::ldexp(1.0, -25)};
  if (hook == "bf16") return {DType::BFloat16, std::ldexp(1.0, -8), std::ldexp(1.0, -134)};
  return {DType::Float64, 0, 0};  // allreduce: no rounding to speak of
}

// Rank r's own gradients, for every rank r: [rank][parameter] -> values.
std::vector<std::vector<std::vector<double>>> gradients_per_rank(nn::Module& model, const Tensor& x, const Tensor& y,
                                                                 int world, int64_t b) {
  std::vector<std::vector<std::vector<double>>> out(world);
  for (int r = 0; r < world; ++r) {
    model.zero_grad();
    cross_entropy(model.forward(x.narrow(0, r * b, b)), y.narrow(0, r * b, b)).backward();
    for (const Tensor& p : model.parameters()) out[r].push_back(p.grad().to_vector<double>());
  }
  model.zero_grad();
  return out;
}

// The averaged gradients of one backward against the ranks' own (Note above): prints up
// to three failures; returns how many gradients differ from the exact average, and counts
// them all in `total`.
int64_t check_gradients(const std::string& hook, const Wire& wire, const std::vector<Tensor>& params,
                        const std::vector<std::vector<std::vector<double>>>& per_rank, int64_t* total) {
  const int world = static_cast<int>(per_rank.size());
  int64_t wrong = 0, rounded = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto got = params[i].grad().to_vector<double>();
    for (size_t k = 0; k < got.size(); ++k) {
      double exact = 0, magnitude = 0, two_rank_sum = 0;
      for (int r = 0; r < world; ++r) {
        const double share = per_rank[r][i][k] / world;
        exact += share;
        magnitude += std::fabs(share);
        if (wire.dtype != DType::Float64) two_rank_sum += wire.round(share);
      }
      bool ok;
      if (wire.dtype == DType::Float64) {
        ok = std::fabs(got[k] - exact) <= 1e-12 * magnitude + 1e-300;
      } else {
        const bool representable = wire.round(got[k]) == got[k];
        const bool within = std::fabs(got[k] - exact) <= world * (wire.unit_roundoff * magnitude + wire.tiny);
        ok = representable && within && (world != 2 || got[k] == wire.round(two_rank_sum));
      }
      rounded += got[k] != exact ? 1 : 0;
      ++*total;
      if (!ok && ++wrong <= 3)
        fail(hook + ": parameter " + std::to_string(i) + " element " + std::to_string(k) + ": gradient " +
             std::to_string(got[k]) + ", exact average " + std::to_string(exact));
    }
  }
  return rounded;
}

// Every rank's own gradients at the replica's current weights (computed on `probe`, a model
// of the same shape), then this rank's DDP backward on its b rows: the hook's averages are in
// the replica's gradients.
std::vector<std::vector<std::vector<double>>> backward_beside_probe(DistributedDataParallel& ddp, optim::Optimizer& opt,
                                                                    nn::Module& probe, const Tensor& x, const Tensor& y,
                                                                    int64_t b) {
  const int rank = get_rank(), world = get_world_size();
  const auto params = ddp.module().parameters(), probe_params = probe.parameters();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) probe_params[i].copy_(params[i]);
  }
  auto per_rank = gradients_per_rank(probe, x, y, world, b);
  opt.zero_grad();
  cross_entropy(ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
  return per_rank;
}

// The largest |a - b| over the parameters' values.
double largest_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto p = a[i].to_vector<double>(), q = b[i].to_vector<double>();
    for (size_t k = 0; k < p.size(); ++k) largest = std::max(largest, std::fabs(p[k] - q[k]));
  }
  return largest;
}

}  // namespace

// Note [What PowerSGD gives]: with error feedback, the hook's input for a parameter is the
// ranks' average gradient plus what the last step left out, A = avg(g) + (A' - G') (A', G':
// the last step's input and output; zero before compression starts, and for gradients sent
// exactly). A compressed gradient's output is G = P P^T A, P the r orthonormal columns the
// power iteration found: at rank 1, G = u u^T A with u any unit column of G. A gradient
// the hook does not compress (a bias; a matrix too small to gain 2x) is the exact average.
// When the rank covers rank(A) (per-rank batch b, world w: rank(A) <= w b, the residuals
// being zero) and Q is drawn afresh each step, the output is A itself, and training equals
// one process on the whole batch. (Not with warm start: its Q spans the last step's
// gradient's rows, which need not cover this one's.)
//
// 20 SGD steps of the MLP with PowerSGD at `approximation_rank` (warm start but where that
// rank covers rank(A)), compression from step 2; every compressed step checked against the
// Note, each rank recomputing every rank's gradient at the replica's weights.
int scenario_powersgd(int64_t approximation_rank, int64_t b) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int world = get_world_size();
  const bool exact = approximation_rank >= world * b;
  auto reference = make_model("mlp"), local = make_model("mlp"), probe = make_model("mlp");
  DDPOptions options;
  options.bucket_cap_mb = 0.002;  // several buckets
  options.first_bucket_mb = 0.001;
  DistributedDataParallel ddp(local, nullptr, options);
  auto state = std::make_shared<PowerSGDState>(
      PowerSGDOptions{.rank = approximation_rank, .start_iteration = 2, .warm_start = !exact});
  ddp.register_comm_hook(powersgd_hook(state));
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD opt_ddp(local->parameters(), optim::SGDOptions{0.05, 0.9});
  const auto params = local->parameters();
  std::vector<std::vector<double>> residual(params.size());
  for (size_t i = 0; i < params.size(); ++i) residual[i].assign(static_cast<size_t>(params[i].numel()), 0.0);
  int compressed_differ = 0;
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = batch(step, world * b, sample_shape("mlp"));
    const auto per_rank = backward_beside_probe(ddp, opt_ddp, *probe, x, y, b);
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = params[i].grad().to_vector<double>();
      std::vector<double> a(g.size());
      double scale = 0;
      for (size_t k = 0; k < g.size(); ++k) {
        for (int r = 0; r < world; ++r) a[k] += per_rank[r][i][k] / world;
        a[k] += residual[i][k];
        scale = std::max(scale, std::fabs(a[k]));
      }
      const int64_t n = params[i].shape()[0], m = params[i].numel() / n;
      const int64_t r = std::min({n, m, approximation_rank});
      const bool compressed = step >= 2 && params[i].dim() >= 2 && (n + m) * r * 2 < n * m;
      // What the hook should give: A, or u u^T A (rank 1) with u the largest column of G.
      std::vector<double> expected = a;
      if (compressed && !exact) {
        int64_t best = 0;
        double best_norm = -1;
        for (int64_t c = 0; c < m; ++c) {
          double norm = 0;
          for (int64_t row = 0; row < n; ++row) norm += g[row * m + c] * g[row * m + c];
          if (norm > best_norm) best_norm = norm, best = c;
        }
        std::vector<double> u(n);
        for (int64_t row = 0; row < n; ++row) u[row] = g[row * m + best] / std::sqrt(best_norm);
        for (int64_t c = 0; c < m; ++c) {
          double dot = 0;
          for (int64_t row = 0; row < n; ++row) dot += u[row] * a[row * m + c];
          for (int64_t row = 0; row < n; ++row) expected[row * m + c] = u[row] * dot;
        }
      }
      double worst = 0;
      for (size_t k = 0; k < g.size(); ++k) worst = std::max(worst, std::fabs(g[k] - expected[k]));
      // The power iteration's rounding, grown by the conditioning of A Q (up to 3e-9 seen).
      if (!(worst <= 1e-7 * scale + 1e-15)) {
        std::ostringstream what;
        what << "step " << step << ", parameter " << i << (compressed ? " (compressed)" : "")
             << ": the gradient is off what the Note says by " << worst << " (scale " << scale << ")";
        fail(what.str());
      }
      double off_average = 0;
      for (size_t k = 0; k < g.size(); ++k) off_average = std::max(off_average, std::fabs(g[k] - a[k]));
      if (compressed && off_average > 1e-6 * scale) ++compressed_differ;
      for (size_t k = 0; k < g.size(); ++k) residual[i][k] = a[k] - g[k];
    }
    opt_ddp.step();
    opt_ref.zero_grad();
    cross_entropy(reference->forward(x), y).backward();
    opt_ref.step();
  }
  if (!exact && compressed_differ == 0) fail("rank 1 changed no gradient: the test cannot tell");
  if (state->iteration() != 20) fail("the state counted " + std::to_string(state->iteration()) + " iterations");
  if (!(state->elements_after() < state->elements_before()))
    fail("sent " + std::to_string(state->elements_after()) + " elements for " +
         std::to_string(state->elements_before()));
  const double largest = largest_difference(params, reference->parameters());
  std::cout << "ok: powersgd rank " << approximation_rank << ", " << world << " ranks of " << b << ": compression "
            << static_cast<double>(state->elements_before()) / static_cast<double>(state->elements_after())
            << "x; after 20 steps the largest parameter difference from one process is " << largest << std::endl;
  if (exact && !(largest <= 1e-9)) fail("parameters differ from one process by " + std::to_string(largest));
  if (!exact && !(largest > 1e-6 && largest <= 0.1))
    fail("parameters differ from one process by " + std::to_string(largest) + " (expected between 1e-6 and 0.1)");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// 20 steps of SGD with the hook, every step's gradients checked element by element against
// the ranks' own at the replica's weights (Note above), and the weights at the end against
// one process trained on the whole batch.
int scenario_comm_hook(const std::string& hook, bool bucket_view) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int world = get_world_size();
  const int64_t b = 3;
  const Wire wire = wire_of(hook);
  auto reference = make_model("mlp");
  auto local = make_model("mlp");
  auto probe = make_model("mlp");  // the replica's weights, to compute every rank's gradients with
  DDPOptions options;
  options.bucket_cap_mb = 0.002;  // several buckets
  options.first_bucket_mb = 0.001;
  options.gradient_as_bucket_view = bucket_view;
  DistributedDataParallel ddp(local, nullptr, options);
  ddp.register_comm_hook(comm_hook_named(hook));
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD opt_ddp(local->parameters(), optim::SGDOptions{0.05, 0.9});

  const auto params = local->parameters(), ref_params = reference->parameters();
  int64_t rounded = 0, total = 0;
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = batch(step, world * b, sample_shape("mlp"));
    const auto per_rank = backward_beside_probe(ddp, opt_ddp, *probe, x, y, b);
    rounded += check_gradients(hook + " step " + std::to_string(step), wire, params, per_rank, &total);
    opt_ddp.step();
    opt_ref.zero_grad();
    cross_entropy(reference->forward(x), y).backward();
    opt_ref.step();
  }
  // The gradients crossed the wire in 16 bits: nearly all differ from the exact average.
  if (wire.dtype != DType::Float64 && rounded < total / 2)
    fail(hook + ": only " + std::to_string(rounded) + " of " + std::to_string(total) + " gradients were rounded");

  const double largest = largest_difference(params, ref_params);
  std::cout << "ok: " << hook << " after 20 steps, the largest parameter difference from one process is " << largest
            << std::endl;
  const double tolerance = wire.dtype == DType::Float64 ? 1e-9 : 3e-2;
  if (!(largest <= tolerance)) fail(hook + ": parameters differ from one process by " + std::to_string(largest));
  if (wire.dtype != DType::Float64 && !(largest > 1e-9)) fail(hook + ": training was not affected by the rounding");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace weft::ddp_worker
