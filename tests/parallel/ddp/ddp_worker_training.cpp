// ddp_worker's scenarios beyond DDP itself: SyncBatchNorm under DDP against BatchNorm2d on
// the whole batch, and a TrainLoop ddp job resumed on another world size against one process,
// plain and with local SGD (test_ddp.cpp starts them; ddp_worker.cpp has main).
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ddp_worker_util.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/ddp/sync_batch_norm.h"
#include "parallel/process_group/distributed.h"
#include "train/distributed_strategy.h"
#include "train/train_loop.h"

namespace weft::ddp_worker {

using namespace weft::parallel;

// ResNet in training mode with its BatchNorm2d layers converted to SyncBatchNorm: DDP over
// the world equals one process with plain BatchNorm2d on the whole batch, running statistics
// included (without the conversion it would not: each rank would use its own statistics).
int scenario_sync_bn(const std::string& optimizer) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int64_t b = 3;
  auto reference = make_model("resnet"), local = make_model("resnet");
  reference->train();
  local->train();
  auto opt_ref = make_optimizer(optimizer, reference->parameters());
  auto opt_ddp = make_optimizer(optimizer, local->parameters());  // made before the conversion, as users do
  if (SyncBatchNorm::convert(local) != local) fail("convert returned another module");
  DDPOptions options;
  options.bucket_cap_mb = 0.02;
  options.first_bucket_mb = 0.005;
  DistributedDataParallel ddp(local, nullptr, options);
  train_side_by_side(*reference, *opt_ref, ddp, *opt_ddp, "resnet", 8, b);
  std::string where;
  if (!close(local->parameters(), reference->parameters(), 1e-9, &where))
    fail("SyncBatchNorm/" + optimizer + ": DDP differs from one process: " + where);
  if (!close(local->buffers(), reference->buffers(), 1e-9, &where))
    fail("SyncBatchNorm/" + optimizer + ": running statistics differ from one process's: " + where);
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// One SyncBatchNorm with a different number of samples on each rank (none on one of them):
// outputs, input and parameter gradients and running statistics equal one BatchNorm2d's on
// all the samples, twice in training mode, then in evaluation mode; float32 far from 0; a
// job with a single value per channel refused on every rank.
int scenario_sync_bn_uneven() {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank(), world = get_world_size();
  const std::vector<int64_t> all_sizes = {3, 0, 1, 2};
  std::vector<int64_t> sizes(all_sizes.begin(), all_sizes.begin() + world);
  int64_t total = 0, offset = 0;
  for (int r = 0; r < world; ++r) {
    if (r == rank) offset = total;
    total += sizes[r];
  }
  const TensorOptions f64(DType::Float64, device());
  auto reference = std::make_shared<nn::BatchNorm2d>(4, 1e-5, 0.3, true, true, f64);
  {
    NoGradGuard no_grad;
    Generator gen(31);
    add_(reference->param("weight"), randn({4}, f64, &gen));
    add_(reference->param("bias"), randn({4}, f64, &gen));
  }
  std::shared_ptr<nn::Module> sync = SyncBatchNorm::convert(reference->clone());
  if (sync->type_name() != "SyncBatchNorm") fail("a BatchNorm2d converted to a " + sync->type_name());
  std::string where;
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 2) {
      reference->eval();
      sync->eval();
    }
    Generator gen(40 + pass);
    Tensor x = mul(randn({total, 4, 3, 5}, f64, &gen), 2.0) + 1.0, g = randn({total, 4, 3, 5}, f64, &gen);
    Tensor all = x.detach().requires_grad_(true);
    Tensor expected = reference->forward(all);
    sum(mul(expected, g)).backward();
    Tensor mine = x.narrow(0, offset, sizes[rank]).contiguous().requires_grad_(true);
    Tensor out = sync->forward(mine);
    sum(mul(out, g.narrow(0, offset, sizes[rank]))).backward();
    const std::string what = "pass " + std::to_string(pass) + ": ";
    if (!close({out}, {expected.narrow(0, offset, sizes[rank])}, 1e-12, &where)) fail(what + "output " + where);
    if (!close({mine.grad()}, {all.grad().narrow(0, offset, sizes[rank])}, 1e-10, &where))
      fail(what + "input gradient " + where);
    std::vector<Tensor> grads;
    for (const Tensor& p : sync->parameters()) {
      Tensor summed = p.grad().clone();
      default_group().all_reduce(summed, ReduceOp::Sum)->wait();
      grads.push_back(summed);
    }
    std::vector<Tensor> expected_grads;
    for (const Tensor& p : reference->parameters()) expected_grads.push_back(p.grad());
    if (!close(grads, expected_grads, 1e-10, &where)) fail(what + "parameter gradients summed over the ranks " + where);
    if (!close(sync->buffers(), reference->buffers(), 1e-12, &where)) fail(what + "running statistics " + where);
    sync->zero_grad();
    reference->zero_grad();
  }
  // float32 values far from 0 (mean 1000, spread 1): the statistics must not cancel (as
  // E[x^2] - E[x]^2 would: float32's spacing at 1e6 is 0.06); BatchNorm2d's kernel is the
  // reference, within 8 spacings of the inputs (6.1e-5 at 1000).
  const TensorOptions f32(DType::Float32, device());
  auto reference32 = std::make_shared<nn::BatchNorm2d>(4, 1e-5, 0.1, true, true, f32);
  std::shared_ptr<nn::Module> sync32 = SyncBatchNorm::convert(reference32->clone());
  Generator gen(50);
  Tensor x32 = add(randn({total, 4, 3, 5}, f32, &gen), 1000.0);
  Tensor expected32 = reference32->forward(x32).narrow(0, offset, sizes[rank]);
  Tensor out32 = sync32->forward(x32.narrow(0, offset, sizes[rank]).contiguous());
  double worst = 0;
  auto got = out32.to_vector<float>(), want = expected32.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
  std::cout << "float32, mean 1000: largest difference from BatchNorm2d " << worst << std::endl;
  if (!(worst <= 5e-4)) fail("float32 with mean 1000: outputs differ from BatchNorm2d's by " + std::to_string(worst));
  // One value per channel in the whole job (on rank 0): every rank refuses it.
  try {
    sync32->forward(zeros({rank == 0 ? 1 : 0, 4, 1, 1}, f32));
    fail("one value per channel over the job was accepted");
  } catch (const Error& e) {
    const std::string expected = "expected more than 1 value per channel when training, got 1 over the " +
                                 std::to_string(world) + " ranks";
    if (std::string(e.what()).find(expected) == std::string::npos) fail("unexpected error: " + std::string(e.what()));
  }
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

namespace {

// Note [Elastic resume equivalence]: a TrainLoop ddp job of R ranks stops at its first
// mid-epoch checkpoint ("stop"), and a job of R' ranks resumes from it ("resume R"). Per-rank
// batch b, DistributedSampler's strided shards: every step of R ranks trains the next R * b
// positions of the epoch's global order (the permutation seeded seed + epoch, continued
// cyclically for padding), and the resumed job trains the rest in steps of R' * b (its last
// step shorter when the remainder's shard is not a multiple of b). So the job equals one
// process taking those position ranges as batches: R * b up to the checkpoint, R' * b after
// it, in every later epoch too. The reference walks the positions itself.
constexpr int64_t kElasticSamples = 100, kElasticBatch = 4, kElasticEvery = 4;
constexpr uint64_t kElasticSeed = 21;

struct ElasticSetup {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::shared_ptr<data::TensorDataset> dataset;
};

ElasticSetup elastic_setup(const std::string& optimizer) {
  ElasticSetup s;
  s.model = make_model("mlp");
  s.optimizer = make_optimizer(optimizer, s.model->parameters());
  Generator gen(11);
  s.dataset = std::make_shared<data::TensorDataset>(randn({kElasticSamples, 20}, TensorOptions(DType::Float64), &gen),
                                                    randint(0, 10, {kElasticSamples}, DType::Int64, &gen));
  return s;
}

// One process training on global positions [begin, end) of `order` in steps of `ranks` * b
// samples. Adds each step's loss times its ranks (the loop sums per-rank batch losses) and
// its ranks.
void reference_steps(ElasticSetup& s, const std::vector<int64_t>& order, int64_t begin, int64_t end, int ranks,
                     double* loss_sum, double* batches) {
  const int64_t n = static_cast<int64_t>(order.size()), step = ranks * kElasticBatch;
  for (int64_t pos = begin; pos < end; pos += step) {
    std::vector<int64_t> rows;
    for (int64_t p = pos; p < std::min(end, pos + step); ++p) rows.push_back(order[p % n]);
    data::Batch batch = s.dataset->get_batch(rows);
    s.optimizer->zero_grad();
    Tensor loss = cross_entropy(s.model->forward(batch.data.to(device())), batch.target.to(device()));
    loss.backward();
    s.optimizer->step();
    *loss_sum += ranks * loss.item<double>();
    *batches += ranks;
  }
}

// Positions a job of `ranks` trains from `start` to the epoch's end: the remainder rounded up
// to a multiple of the ranks (DistributedSampler's padding).
int64_t padded_end(int64_t start, int ranks) {
  return start + (kElasticSamples - start + ranks - 1) / ranks * ranks;
}

struct StopAtFirstCheckpoint : train::Callback {
  void on_checkpoint(train::TrainLoop& loop) override { loop.request_stop(); }
};

// The order of the epoch's positions: DistributedSampler's permutation.
std::vector<int64_t> epoch_order(int epoch) {
  Generator gen(kElasticSeed + epoch);
  return randperm(kElasticSamples, DType::Int64, &gen).to_vector<int64_t>();
}

// The job's loop: ddp (several buckets), a checkpoint every kElasticEvery steps, no output;
// evaluating `val` after each epoch where it is given.
std::unique_ptr<train::TrainLoop> elastic_loop(ElasticSetup& s, const std::string& checkpoint,
                                               train::DistributedStrategyOptions strategy, std::ostringstream& log,
                                               std::shared_ptr<data::DataLoader> val = nullptr) {
  data::DataLoaderOptions loader;
  loader.batch_size = kElasticBatch;
  loader.shuffle = true;
  loader.seed = kElasticSeed;
  strategy.device = device();
  strategy.ddp.bucket_cap_mb = 0.02;
  strategy.ddp.first_bucket_mb = 0.005;
  train::TrainLoopOptions options;
  options.strategy = std::make_shared<train::DistributedStrategy>(strategy);
  options.checkpoint_path = checkpoint;
  options.checkpoint_every = kElasticEvery;
  options.progress = false;
  options.log = &log;
  return std::make_unique<train::TrainLoop>(
      s.model, std::make_shared<data::DataLoader>(s.dataset, loader), std::move(val), nullptr, s.optimizer,
      [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }, options);
}

}  // namespace

//   ddp_worker elastic stop OPTIMIZER CHECKPOINT
//   ddp_worker elastic resume OPTIMIZER CHECKPOINT RANKS_BEFORE
int scenario_elastic(const std::string& phase, const std::string& optimizer, const std::string& checkpoint,
                     int ranks_before) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int world = get_world_size(), world_before = phase == "stop" ? world : ranks_before;
  ElasticSetup s = elastic_setup(optimizer);
  std::ostringstream log;
  std::unique_ptr<train::TrainLoop> job = elastic_loop(s, checkpoint, {}, log);
  train::TrainLoop& loop = *job;
  const int64_t stopped_at = kElasticEvery * kElasticBatch * world_before;
  if (phase == "stop") {
    loop.add_callback(std::make_shared<StopAtFirstCheckpoint>());
    loop.fit(2);
    if (loop.epoch() != 0 || loop.epoch_samples() != stopped_at)
      fail("stopped after epoch " + std::to_string(loop.epoch()) + " + " + std::to_string(loop.epoch_samples()) +
           " samples, not 0 + " + std::to_string(stopped_at));
    destroy_process_group();
    return failures == 0 ? 0 : 1;
  }
  loop.resume(checkpoint);
  if (loop.epoch_samples() != stopped_at)
    fail("the checkpoint is " + std::to_string(loop.epoch_samples()) + " samples into the epoch");
  const auto results = loop.fit(2);

  // The reference, and one that wrongly assumes the world size never changed: the DDP job
  // must match the first and not the second, or the test could not tell them apart.
  auto order = epoch_order;
  std::vector<double> loss_means;
  ElasticSetup ref = elastic_setup(unsharded(optimizer)), unchanged = elastic_setup(unsharded(optimizer));
  double ignored_sum = 0, ignored_batches = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    double loss_sum = 0, batches = 0;
    const int64_t start = epoch == 0 ? stopped_at : 0;
    if (epoch == 0) reference_steps(ref, order(0), 0, stopped_at, world_before, &loss_sum, &batches);
    reference_steps(ref, order(epoch), start, padded_end(start, world), world, &loss_sum, &batches);
    loss_means.push_back(loss_sum / batches);
    reference_steps(unchanged, order(epoch), 0, padded_end(0, world_before), world_before, &ignored_sum,
                    &ignored_batches);
  }
  std::string where;
  const std::string what = optimizer + ", " + std::to_string(world_before) + " -> " + std::to_string(world) + " ranks";
  if (!close(s.model->parameters(), ref.model->parameters(), 1e-9, &where))
    fail(what + ": the resumed job differs from one process taking the same positions: " + where);
  if (close(s.model->parameters(), unchanged.model->parameters(), 1e-6, &where))
    fail(what + ": the job also equals training without the change of world size: the test cannot tell");
  if (results.size() != 2) fail(what + ": fit completed " + std::to_string(results.size()) + " epochs, not 2");
  for (size_t e = 0; e < results.size() && e < loss_means.size(); ++e)
    if (!(std::fabs(results[e].train_loss - loss_means[e]) <= 1e-9 * std::fabs(loss_means[e])))
      fail(what + ": epoch " + std::to_string(e + 1) + "'s mean loss is " + std::to_string(results[e].train_loss) +
           ", the reference's " + std::to_string(loss_means[e]));
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

namespace {

// Note [Local SGD's TrainLoop reference]: the job of Note [Elastic resume equivalence] with
// local SGD (Note [Local SGD in the TrainLoop]: averages every kLocalPeriod steps after a
// warm-up of kLocalWarmup), against one process that keeps a replica and an optimizer per
// rank. At each loop step every replica computes the gradient of its rank's rows (rank r of R
// takes positions start + r + i R of the epoch's order, i counting its samples); during the
// warm-up each takes the mean over all replicas, after it its own; each optimizer steps; where
// the averager averages, the replicas' parameters become their mean. After each mid-epoch
// checkpoint step and at each epoch's end, once a local step has been taken, the replicas'
// parameters and optimizer states become their means. A resumed job of R' ranks starts R'
// replicas from the checkpoint's (consolidated) one, and numbers its steps from the epoch's
// position as the loop does: start / R' / b. Each epoch's validation loss is the consolidated
// model's.
constexpr int64_t kLocalPeriod = 3, kLocalWarmup = 2;

struct LocalReference {
  std::vector<ElasticSetup> replicas;
  int64_t steps = 0;  // taken so far: the averager's count
  double spread = 0;  // the largest difference between two replicas' parameters seen
};

// Every replica's `values[r][i]` replaced by the mean of values[*][i].
void average_over_replicas(const std::vector<std::vector<Tensor>>& values) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < values[0].size(); ++i) {
    Tensor mean = zeros_like(values[0][i]);
    for (const auto& replica : values) mean = add(mean, replica[i]);
    mean = div(mean, static_cast<double>(values.size()));
    for (const auto& replica : values) replica[i].copy_(mean);
  }
}

void consolidate(LocalReference& ref) {
  if (ref.steps <= kLocalWarmup) return;
  std::vector<std::vector<Tensor>> params, states;
  for (ElasticSetup& r : ref.replicas) {
    params.push_back(r.model->parameters());
    states.emplace_back();
    for (const auto& [name, t] : r.optimizer->state_dict().tensors) states.back().push_back(t);
  }
  NoGradGuard no_grad;
  for (size_t r = 1; r < params.size(); ++r)
    for (size_t i = 0; i < params[0].size(); ++i)
      ref.spread = std::max(ref.spread, amax(abs(sub(params[r][i], params[0][i]))).item<double>());
  average_over_replicas(params);
  average_over_replicas(states);
}

// Trains the epoch from position `start` as a job of ref.replicas.size() ranks, up to the
// loop step numbered `stop_after` (a mid-epoch checkpoint), or to the epoch's end.
void local_epoch(LocalReference& ref, const std::vector<int64_t>& order, int64_t start, int64_t stop_after,
                 double* loss_sum, double* batches) {
  const int64_t ranks = static_cast<int64_t>(ref.replicas.size()), n = static_cast<int64_t>(order.size());
  const int64_t b = kElasticBatch, per_rank = (n - start + ranks - 1) / ranks;  // padded
  const int64_t first = start / ranks / b, steps = first + (per_rank + b - 1) / b;
  for (int64_t step = first; step < steps; ++step) {
    const int64_t k = step - first;
    std::vector<std::vector<Tensor>> grads;
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<int64_t> rows;
      for (int64_t i = k * b; i < std::min(per_rank, k * b + b); ++i)
        rows.push_back(order[(start + r + i * ranks) % n]);
      data::Batch batch = ref.replicas[r].dataset->get_batch(rows);
      ElasticSetup& replica = ref.replicas[r];
      replica.optimizer->zero_grad();
      Tensor loss = cross_entropy(replica.model->forward(batch.data.to(device())), batch.target.to(device()));
      loss.backward();
      *loss_sum += loss.item<double>();
      *batches += 1;
      grads.emplace_back();
      for (const Tensor& p : replica.model->parameters()) grads.back().push_back(p.grad());
    }
    if (ref.steps < kLocalWarmup) average_over_replicas(grads);
    for (ElasticSetup& replica : ref.replicas) replica.optimizer->step();
    if (ref.steps >= kLocalWarmup && (ref.steps - kLocalWarmup) % kLocalPeriod == 0) {
      std::vector<std::vector<Tensor>> params;
      for (ElasticSetup& replica : ref.replicas) params.push_back(replica.model->parameters());
      average_over_replicas(params);
    }
    ++ref.steps;
    if ((step + 1) % kElasticEvery == 0 && step + 1 < steps) {
      consolidate(ref);
      if (step + 1 == stop_after) return;
    }
  }
  consolidate(ref);
}

// `ranks` replicas, each a copy of `from`'s model and optimizer state.
void restart_replicas(LocalReference& ref, const ElasticSetup& from, int ranks, const std::string& optimizer) {
  std::vector<ElasticSetup> replicas;
  for (int r = 0; r < ranks; ++r) {
    replicas.push_back(elastic_setup(optimizer));
    replicas.back().model->load_state_dict(from.model->state_dict());
    replicas.back().optimizer->load_state_dict(from.optimizer->state_dict());
  }
  ref.replicas = std::move(replicas);
}

}  // namespace

//   ddp_worker elastic_local_sgd stop OPTIMIZER CHECKPOINT
//   ddp_worker elastic_local_sgd resume OPTIMIZER CHECKPOINT RANKS_BEFORE
int scenario_elastic_local_sgd(const std::string& phase, const std::string& optimizer, const std::string& checkpoint,
                               int ranks_before) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int world = get_world_size(), world_before = phase == "stop" ? world : ranks_before;
  ElasticSetup s = elastic_setup(optimizer);
  train::DistributedStrategyOptions local;
  local.local_sgd_period = kLocalPeriod;
  local.local_sgd_warmup = kLocalWarmup;
  // Evaluated after each epoch: the loop must have made the replicas one first.
  Generator val_gen(12);
  const Tensor val_x = randn({30, 20}, TensorOptions(DType::Float64), &val_gen);
  const Tensor val_y = randint(0, 10, {30}, DType::Int64, &val_gen);
  auto val_set = std::make_shared<data::TensorDataset>(val_x, val_y);
  data::DataLoaderOptions val_options;
  val_options.batch_size = 8;
  std::ostringstream log;
  std::unique_ptr<train::TrainLoop> job =
      elastic_loop(s, checkpoint, local, log, std::make_shared<data::DataLoader>(val_set, val_options));
  train::TrainLoop& loop = *job;
  auto& strategy = dynamic_cast<train::DistributedStrategy&>(loop.strategy());
  const int64_t stopped_at = kElasticEvery * kElasticBatch * world_before;
  if (phase == "stop") {
    loop.add_callback(std::make_shared<StopAtFirstCheckpoint>());
    loop.fit(2);
    if (loop.epoch() != 0 || loop.epoch_samples() != stopped_at || strategy.local_sgd_step() != kElasticEvery)
      fail("stopped after epoch " + std::to_string(loop.epoch()) + " + " + std::to_string(loop.epoch_samples()) +
           " samples and " + std::to_string(strategy.local_sgd_step()) + " local SGD steps");
    destroy_process_group();
    return failures == 0 ? 0 : 1;
  }
  loop.resume(checkpoint);
  if (strategy.local_sgd_step() != kElasticEvery)
    fail("resumed at local SGD step " + std::to_string(strategy.local_sgd_step()));
  const auto results = loop.fit(2);

  LocalReference ref;
  for (int r = 0; r < world_before; ++r) ref.replicas.push_back(elastic_setup(optimizer));
  std::vector<double> loss_means, val_losses;
  auto val_loss = [&] {
    NoGradGuard no_grad;
    return cross_entropy(ref.replicas[0].model->forward(val_x.to(device())), val_y.to(device())).item<double>();
  };
  double loss_sum = 0, batches = 0;
  local_epoch(ref, epoch_order(0), 0, kElasticEvery, &loss_sum, &batches);
  const ElasticSetup saved = ref.replicas[0];
  restart_replicas(ref, saved, world, optimizer);
  local_epoch(ref, epoch_order(0), stopped_at, -1, &loss_sum, &batches);
  loss_means.push_back(loss_sum / batches);
  val_losses.push_back(val_loss());
  loss_sum = batches = 0;
  local_epoch(ref, epoch_order(1), 0, -1, &loss_sum, &batches);
  loss_means.push_back(loss_sum / batches);
  val_losses.push_back(val_loss());

  std::string where;
  const std::string what = optimizer + ", " + std::to_string(world_before) + " -> " + std::to_string(world) + " ranks";
  if (!close(s.model->parameters(), ref.replicas[0].model->parameters(), 1e-9, &where))
    fail(what + ": the resumed job differs from the reference's replicas: " + where);
  std::vector<Tensor> state, expected_state;
  for (const auto& [name, t] : s.optimizer->state_dict().tensors) state.push_back(t);
  for (const auto& [name, t] : ref.replicas[0].optimizer->state_dict().tensors) expected_state.push_back(t);
  if (!close(state, expected_state, 1e-9, &where)) fail(what + ": the optimizer's state differs: " + where);
  if (ref.spread < 1e-6)
    fail(what + ": the reference's replicas never drifted apart (largest difference " + std::to_string(ref.spread) +
         ")");
  if (strategy.local_sgd_step() != ref.steps)
    fail(what + ": " + std::to_string(strategy.local_sgd_step()) + " local SGD steps, the reference took " +
         std::to_string(ref.steps));
  if (results.size() != 2) fail(what + ": fit completed " + std::to_string(results.size()) + " epochs, not 2");
  for (size_t e = 0; e < results.size() && e < loss_means.size(); ++e)
    if (!(std::fabs(results[e].train_loss - loss_means[e]) <= 1e-9 * std::fabs(loss_means[e])))
      fail(what + ": epoch " + std::to_string(e + 1) + "'s mean loss is " + std::to_string(results[e].train_loss) +
           ", the reference's " + std::to_string(loss_means[e]));
  for (size_t e = 0; e < results.size() && e < val_losses.size(); ++e) {
    const double got = results[e].val ? results[e].val->loss : -1;
    if (!(std::fabs(got - val_losses[e]) <= 1e-9 * std::fabs(val_losses[e])))
      fail(what + ": epoch " + std::to_string(e + 1) + "'s validation loss is " + std::to_string(got) +
           ", the consolidated reference's " + std::to_string(val_losses[e]));
  }
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

//   ddp_worker local_sgd_buffers
// A ResNet in training mode under local SGD with broadcast_buffers off: each rank's running
// statistics follow its own batches, and the epoch's end must leave every rank with the same
// ones (consolidate_replicas averages the floating buffers), and the same parameters.
int scenario_local_sgd_buffers() {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  auto model = make_model("resnet");
  model->train();
  auto optimizer = make_optimizer("sgd", model->parameters());
  Generator gen(13);
  auto dataset = std::make_shared<data::TensorDataset>(randn({24, 1, 12, 12}, TensorOptions(DType::Float64), &gen),
                                                       randint(0, 10, {24}, DType::Int64, &gen));
  data::DataLoaderOptions loader;
  loader.batch_size = 4;
  loader.shuffle = true;
  train::DistributedStrategyOptions strategy;
  strategy.device = device();
  strategy.ddp.broadcast_buffers = false;
  strategy.local_sgd_period = 2;
  train::TrainLoopOptions options;
  options.strategy = std::make_shared<train::DistributedStrategy>(strategy);
  options.progress = false;
  std::ostringstream log;
  options.log = &log;
  train::TrainLoop loop(model, std::make_shared<data::DataLoader>(dataset, loader), nullptr, nullptr, optimizer,
                        [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }, options);
  loop.fit(1);
  NoGradGuard no_grad;
  auto check_same = [&](const std::string& what, const Tensor& t) {
    Tensor high = t.to(DType::Float64).clone(), low = neg(t.to(DType::Float64));
    default_group().all_reduce(high, ReduceOp::Max)->wait();
    default_group().all_reduce(low, ReduceOp::Max)->wait();
    const double spread = amax(add(high, low)).item<double>();  // max - min, element by element
    if (!(spread <= 1e-12 * std::max(1.0, amax(abs(high)).item<double>())))
      fail(what + " differs between the ranks by " + std::to_string(spread));
  };
  for (const auto& [name, b] : model->named_buffers())
    if (is_floating(b.dtype())) check_same("buffer " + name, b);
  for (const auto& [name, p] : model->named_parameters()) check_same("parameter " + name, p);
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace weft::ddp_worker
