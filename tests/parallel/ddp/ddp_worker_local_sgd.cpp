// ddp_worker's local SGD scenarios (see ddp_worker.cpp): DDP with the post-local SGD
// hook (parallel/ddp/post_localsgd_hook.h) and a PostLocalSGDOptimizer whose averager is
// periodic or hierarchical (parallel/optim/model_averaging.h), against one process that keeps a
// replica per rank and does what the job must do (Note [Local SGD's reference]).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ddp_worker_util.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/ddp/post_localsgd_hook.h"
#include "parallel/optim/model_averaging.h"
#include "parallel/optim/post_localsgd_optimizer.h"
#include "parallel/process_group/distributed.h"

namespace weft::ddp_worker {

namespace {

using namespace weft::parallel;

// "P": a PeriodicModelAverager of period P; "P1:S1,P2:S2,...": a HierarchicalModelAverager.
std::vector<std::pair<int64_t, int>> parse_levels(const std::string& spec) {
  std::vector<std::pair<int64_t, int>> levels;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t colon = item.find(':');
    const int size = colon == std::string::npos ? 0 : std::stoi(item.substr(colon + 1));
    levels.emplace_back(std::stoll(item.substr(0, colon)), size);
  }
  return levels;
}

// The size of the groups the averager of `levels` averages within at `step`; 0: none.
int reference_group_size(const std::vector<std::pair<int64_t, int>>& levels, int64_t start, int64_t step, int world) {
  if (step < start) return 0;
  if (levels.size() == 1 && levels[0].second == 0)  // periodic: counted from the warm-up
    return (step - start) % levels[0].first == 0 ? world : 0;
  for (auto level = levels.rbegin(); level != levels.rend(); ++level)  // hierarchical: from step 0
    if (step % level->first == 0) return level->second;
  return 0;
}

// Replaces `values[r]` by the mean over the replicas of r's group, for groups of
// `group_size` consecutive ranks (1: each its own).
void average_within_groups(std::vector<std::vector<Tensor>>& values, int group_size) {
  NoGradGuard no_grad;
  const int world = static_cast<int>(values.size());
  for (int first = 0; first < world; first += group_size)
    for (size_t i = 0; i < values[0].size(); ++i) {
      Tensor mean = zeros_like(values[first][i]);
      for (int r = first; r < first + group_size; ++r) mean = add(mean, values[r][i]);
      mean = div(mean, static_cast<double>(group_size));
      for (int r = first; r < first + group_size; ++r) values[r][i].copy_(mean);
    }
}

std::vector<std::vector<Tensor>> grads_of(const std::vector<std::shared_ptr<nn::Module>>& replicas) {
  std::vector<std::vector<Tensor>> out;
  for (const auto& m : replicas) {
    out.emplace_back();
    for (const Tensor& p : m->parameters()) out.back().push_back(p.grad());
  }
  return out;
}

std::vector<std::vector<Tensor>> params_of(const std::vector<std::shared_ptr<nn::Module>>& replicas) {
  std::vector<std::vector<Tensor>> out;
  for (const auto& m : replicas) out.push_back(m->parameters());
  return out;
}

}  // namespace

// Note [Local SGD's reference]: the process keeps one replica and one optimizer per rank,
// all from the same weights. At step s each replica computes the gradient of its rank's rows;
// before `start` every replica takes the mean over all of them (DDP's all-reduce), from then
// on the mean over its subgroup or its own gradient (no gradient all-reduce); each replica's
// optimizer steps on what it took; then, where the averager averages at s, each replica's
// parameters become the mean over its averaging group. After every step this rank's DDP
// replica must equal its replica in the reference (1e-9, float64). The reference's replicas
// must differ somewhere (else the scenario tests nothing that plain DDP does not).
//
//   local_sgd OPTIMIZER START AVERAGER SUBGROUP [views] [micro2]
// AVERAGER: see parse_levels. SUBGROUP: "none" (post_local_gradient_allreduce off), a group
// size given to new_subgroups() here, or "machine:G": the state makes its default subgroup,
// one per machine, with LOCAL_WORLD_SIZE set to G here (machines of G ranks). views: gradients
// as bucket views; micro2: two micro-batches of one row a step, the first under no_sync.
int scenario_local_sgd(const std::string& optimizer, int64_t start, const std::string& averager_spec,
                       const std::string& subgroup_spec, const std::vector<std::string>& flags) {
  auto has = [&](const char* flag) { return std::find(flags.begin(), flags.end(), flag) != flags.end(); };
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank(), world = get_world_size();
  const int64_t b = 2, steps = 12;
  const bool micro = has("micro2");
  const bool allreduce_after = subgroup_spec != "none";
  const bool per_machine = subgroup_spec.rfind("machine:", 0) == 0;
  const int subgroup_size = !allreduce_after ? 1 : std::stoi(per_machine ? subgroup_spec.substr(8) : subgroup_spec);
  const auto levels = parse_levels(averager_spec);

  std::vector<std::shared_ptr<nn::Module>> replicas;
  std::vector<std::shared_ptr<optim::Optimizer>> optimizers;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(make_model("mlp"));
    optimizers.push_back(make_optimizer(optimizer, replicas.back()->parameters()));
  }

  auto local = make_model("mlp");
  DDPOptions options;
  options.bucket_cap_mb = 0.002;  // several buckets
  options.first_bucket_mb = 0.001;
  options.gradient_as_bucket_view = has("views");
  DistributedDataParallel ddp(local, nullptr, options);
  PostLocalSGDOptions hook_options{.start_iteration = start, .post_local_gradient_allreduce = allreduce_after};
  std::shared_ptr<PostLocalSGDState> state;
  if (per_machine) {  // the variables a launcher sets on machines of subgroup_size ranks, while the state is made
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    for (const char* name : {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
      const char* value = std::getenv(name);
      saved.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
    }
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(subgroup_size).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank % subgroup_size).c_str(), 1);
    state = std::make_shared<PostLocalSGDState>(hook_options);
    for (const auto& [name, value] : saved)  // the worker's device follows LOCAL_RANK (worker_backend.h)
      value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str());
  } else {
    if (allreduce_after) hook_options.subgroup = new_subgroups(subgroup_size);
    state = std::make_shared<PostLocalSGDState>(hook_options);
  }
  const auto& subgroup = state->subgroup();
  if (allreduce_after && (subgroup->size() != subgroup_size || subgroup->rank() != rank % subgroup_size))
    fail("the subgroup (" + subgroup_spec + ") has rank " + std::to_string(subgroup->rank()) + " of " +
         std::to_string(subgroup->size()));
  ddp.register_comm_hook(post_localsgd_hook(state));
  std::shared_ptr<ModelAverager> averager;
  if (levels.size() == 1 && levels[0].second == 0)
    averager = std::make_shared<PeriodicModelAverager>(levels[0].first, start);
  else
    averager = std::make_shared<HierarchicalModelAverager>(levels, start);
  PostLocalSGDOptimizer opt(make_optimizer(optimizer, local->parameters()), averager);

  double spread = 0;  // the largest difference between two replicas of the reference
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = batch(static_cast<int>(s), world * b, sample_shape("mlp"));
    for (int r = 0; r < world; ++r) {
      optimizers[r]->zero_grad();
      for (int64_t m = 0; m < (micro ? 2 : 1); ++m) {  // micro-batches: gradients summed
        const int64_t rows = micro ? 1 : b;
        cross_entropy(replicas[r]->forward(x.narrow(0, r * b + m * rows, rows)), y.narrow(0, r * b + m * rows, rows))
            .backward();
      }
    }
    auto grads = grads_of(replicas);
    average_within_groups(grads, s < start ? world : subgroup_size);
    for (auto& o : optimizers) o->step();
    auto params = params_of(replicas);
    if (int size = reference_group_size(levels, start, s, world)) average_within_groups(params, size);
    for (int r = 1; r < world; ++r) {
      NoGradGuard no_grad;
      for (size_t i = 0; i < params[0].size(); ++i)
        spread = std::max(spread, amax(abs(sub(params[r][i], params[0][i]))).item<double>());
    }

    opt.zero_grad();
    if (micro) {
      {
        auto guard = ddp.no_sync();
        cross_entropy(ddp(x.narrow(0, rank * b, 1)), y.narrow(0, rank * b, 1)).backward();
      }
      cross_entropy(ddp(x.narrow(0, rank * b + 1, 1)), y.narrow(0, rank * b + 1, 1)).backward();
    } else {
      cross_entropy(ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
    }
    opt.step();
    std::string where;
    // After a difference every rank goes on with the same collectives: a rank that stopped
    // would leave the others waiting for it until the timeout.
    if (failures == 0 && !close(local->parameters(), replicas[rank]->parameters(), 1e-9, &where))
      fail("step " + std::to_string(s) + ": the replica differs from the reference's rank " + std::to_string(rank) +
           ": " + where);
  }
  if (spread < 1e-6)
    fail("the reference's replicas never drifted apart (largest difference " + std::to_string(spread) + ")");
  if (state->iteration() != steps || averager->step() != steps)
    fail("counted " + std::to_string(state->iteration()) + " backward passes and " + std::to_string(averager->step()) +
         " averager steps");
  if (const double saved = opt.state_dict().scalars.at("averager_step"); saved != static_cast<double>(steps))
    fail("the state saved averager_step " + std::to_string(saved));
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace weft::ddp_worker
