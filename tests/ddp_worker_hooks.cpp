// ddp_worker's communication-hook scenario (see tests/ddp_worker.cpp): DDP with the
// allreduce, fp16 or bf16 hook of parallel/comm_hooks.h against the ranks' own gradients,
// rounded as the hook rounds them, and against one process training on the whole batch.
#include <cmath>
#include <string>
#include <vector>

#include "ddp_worker_util.h"
#include "parallel/comm_hooks.h"
#include "parallel/distributed.h"
#include "parallel/distributed_data_parallel.h"

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

}  // namespace

// 20 steps of SGD with the hook, every step's gradients checked element by element against
// the ranks' own at the replica's weights (Note above), and the weights at the end against
// one process trained on the whole batch.
int scenario_comm_hook(const std::string& hook, bool bucket_view) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank(), world = get_world_size();
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

  const auto params = local->parameters(), probe_params = probe->parameters(), ref_params = reference->parameters();
  int64_t rounded = 0, total = 0;
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = batch(step, world * b, sample_shape("mlp"));
    {
      NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) probe_params[i].copy_(params[i]);
    }
    const auto per_rank = gradients_per_rank(*probe, x, y, world, b);
    opt_ddp.zero_grad();
    cross_entropy(ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
    rounded += check_gradients(hook + " step " + std::to_string(step), wire, params, per_rank, &total);
    opt_ddp.step();
    opt_ref.zero_grad();
    cross_entropy(reference->forward(x), y).backward();
    opt_ref.step();
  }
  // The gradients crossed the wire in 16 bits: nearly all differ from the exact average.
  if (wire.dtype != DType::Float64 && rounded < total / 2)
    fail(hook + ": only " + std::to_string(rounded) + " of " + std::to_string(total) + " gradients were rounded");

  double largest = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto p = params[i].to_vector<double>(), q = ref_params[i].to_vector<double>();
    for (size_t k = 0; k < p.size(); ++k) largest = std::max(largest, std::fabs(p[k] - q[k]));
  }
  std::cout << "ok: " << hook << " after 20 steps, the largest parameter difference from one process is " << largest
            << std::endl;
  const double tolerance = wire.dtype == DType::Float64 ? 1e-9 : 3e-2;
  if (!(largest <= tolerance)) fail(hook + ": parameters differ from one process by " + std::to_string(largest));
  if (wire.dtype != DType::Float64 && !(largest > 1e-9)) fail(hook + ": training was not affected by the rounding");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace weft::ddp_worker
