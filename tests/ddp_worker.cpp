// One rank of the DistributedDataParallel tests (tests/test_ddp.cpp starts several):
//
//   ddp_worker SCENARIO [ARGS]     (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)
//
// Every rank can compute the single-process reference itself (the data of every step is a
// function of the step, each rank training on its rows of it), so each rank checks its own
// DDP replica against the reference. Prints "FAIL: ..." lines and exits 1 on a failure.
// WEFT_TEST_BACKEND=nccl runs on CUDA ranks (cuda:LOCAL_RANK modulo the devices; the
// reference on the same device); the default is gloo on the CPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <weft.h>

#include "parallel/distributed.h"
#include "parallel/distributed_data_parallel.h"
#include "train/distributed_strategy.h"
#include "train/train_loop.h"
#include "worker_backend.h"

using namespace weft;
using namespace weft::parallel;

namespace {

int failures = 0;

std::string backend() { return test::worker_backend(); }
Device device() { return test::worker_device(); }
void fail(const std::string& what) {
  std::cout << "FAIL: rank " << get_rank() << ": " << what << std::endl;
  ++failures;
}

std::shared_ptr<nn::Module> make_model(const std::string& name) {
  Generator gen(7);
  std::shared_ptr<nn::Module> m;
  if (name == "convnet") m = std::make_shared<nn::ConvNet>(10, &gen);
  else if (name == "resnet") m = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
  else m = std::make_shared<nn::MLP>(20, std::vector<int64_t>{16, 12}, 10, 0.0, &gen);
  m->to(DType::Float64);
  m->to(device());
  if (name == "resnet") m->eval();  // BatchNorm on running statistics: what DDP matches (Note in test_ddp.cpp)
  return m;
}

Shape sample_shape(const std::string& model) { return model == "mlp" ? Shape{20} : model == "resnet" ? Shape{1, 12, 12} : Shape{1, 28, 28}; }

std::shared_ptr<optim::Optimizer> make_optimizer(const std::string& name, const std::vector<Tensor>& params) {
  if (name == "adam") return std::make_shared<optim::Adam>(params, optim::AdamOptions{0.01});
  return std::make_shared<optim::SGD>(params, optim::SGDOptions{0.05, 0.9});
}

// The global batch of step s: ranks * per_rank samples.
std::pair<Tensor, Tensor> batch(int step, int64_t rows, const Shape& sample) {
  Generator gen(1000 + step);
  Shape shape = sample;
  shape.insert(0, rows);
  return {randn(shape, TensorOptions(DType::Float64), &gen).to(device()),
          randint(0, 10, {rows}, DType::Int64, &gen).to(device())};
}

bool close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol, std::string* where) {
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k)
      if (!(std::fabs(x[k] - y[k]) <= 1e-12 + rtol * std::fabs(y[k]))) {
        std::ostringstream out;
        out << "parameter " << i << " element " << k << ": " << x[k] << " vs " << y[k];
        *where = out.str();
        return false;
      }
  }
  return true;
}

// DDP over the world, per-rank batch b, against one process on the whole batch.
int scenario_equivalence(const std::string& model, const std::string& optimizer, bool bucket_view) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank(), world = get_world_size();
  const int64_t b = 3;
  auto reference = make_model(model);
  auto local = make_model(model);
  DDPOptions options;
  options.bucket_cap_mb = 0.02;  // several buckets even for the MLP
  options.first_bucket_mb = 0.005;
  options.gradient_as_bucket_view = bucket_view;
  DistributedDataParallel ddp(local, nullptr, options);
  auto opt_ref = make_optimizer(optimizer, reference->parameters());
  auto opt_ddp = make_optimizer(optimizer, local->parameters());
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = batch(step, world * b, sample_shape(model));
    opt_ref->zero_grad();
    cross_entropy(reference->forward(x), y).backward();
    opt_ref->step();
    opt_ddp->zero_grad();
    cross_entropy(ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
    opt_ddp->step();
  }
  std::string where;
  if (!close(local->parameters(), reference->parameters(), 1e-9, &where))
    fail(model + "/" + optimizer + (bucket_view ? "/bucket views" : "") + ": DDP differs from one process: " + where);
  if (ddp.reducer().iterations() != 20) fail("the reducer counted " + std::to_string(ddp.reducer().iterations()));
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Two backward passes under no_sync, then a synchronised one: the same as one process
// accumulating the three full batches' gradients.
int scenario_no_sync() {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank(), world = get_world_size();
  const int64_t b = 2;
  auto reference = make_model("mlp");
  auto local = make_model("mlp");
  DistributedDataParallel ddp(local);
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.1});
  optim::SGD opt_ddp(local->parameters(), optim::SGDOptions{0.1});
  for (int round = 0; round < 3; ++round) {
    opt_ref.zero_grad();
    opt_ddp.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      auto [x, y] = batch(10 * round + micro, world * b, Shape{20});
      cross_entropy(reference->forward(x), y).backward();
      Tensor mine = x.narrow(0, rank * b, b), labels = y.narrow(0, rank * b, b);
      if (micro < 2) {
        auto guard = ddp.no_sync();
        cross_entropy(ddp(mine), labels).backward();
        if (ddp.reducer().expecting_gradients()) fail("no_sync readied the reducer");
      } else {
        cross_entropy(ddp(mine), labels).backward();
      }
    }
    opt_ref.step();
    opt_ddp.step();
  }
  std::string where;
  if (!close(local->parameters(), reference->parameters(), 1e-9, &where)) fail("no_sync: " + where);
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// A model whose second layer takes no part in the forward.
struct HalfUsed : nn::Cloneable<HalfUsed> {
  HalfUsed() : Cloneable("HalfUsed") {
    Generator gen(3);
    register_module("used", std::make_shared<nn::Linear>(4, 3, true, TensorOptions(DType::Float64), &gen));
    register_module("unused", std::make_shared<nn::Linear>(4, 3, true, TensorOptions(DType::Float64), &gen));
  }
  Tensor forward(const Tensor& x) override { return child("used")(x); }
};

int scenario_unused(bool find_unused) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(20)});
  auto model = std::make_shared<HalfUsed>();
  model->to(device());
  DDPOptions options;
  options.find_unused_parameters = find_unused;
  DistributedDataParallel ddp(model, nullptr, options);
  optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1});
  try {
    for (int step = 0; step < 3; ++step) {
      Generator gen(50 + step);
      Tensor x = randn({4, 4}, DType::Float64, &gen).to(device()), y = randint(0, 3, {4}, DType::Int64, &gen).to(device());
      sgd.zero_grad();
      cross_entropy(ddp(x), y).backward();
      sgd.step();
    }
    if (!find_unused) fail("an unused parameter went unnoticed");
    if (model->child("unused").param("weight").grad().defined()) fail("the unused weight got a gradient");
    if (!model->child("used").param("weight").grad().defined()) fail("the used weight got no gradient");
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << std::endl;
    if (find_unused) fail("find_unused_parameters: " + std::string(e.what()));
  }
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Branch `a` always takes part, `b` when asked, `c` never.
struct Branches : nn::Cloneable<Branches> {
  bool use_b = false;
  Branches() : Cloneable("Branches") {
    Generator gen(4);
    for (const char* name : {"a", "b", "c"})
      register_module(name, std::make_shared<nn::Linear>(4, 3, true, TensorOptions(DType::Float64), &gen));
  }
  Tensor forward(const Tensor& x) override { return use_b ? child("a")(x) + child("b")(x) : child("a")(x); }
};

// With find_unused_parameters, a parameter some ranks used is averaged with the others'
// zeros; one used only under no_sync is still reduced at the next synchronised backward;
// one no rank used keeps its gradient as it was. Checked against one process summing every
// rank's loss / world with each rank's choice of branches.
int scenario_partial_use() {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank(), world = get_world_size();
  const int64_t b = 2;
  auto reference = std::make_shared<Branches>();
  auto local = std::make_shared<Branches>();
  reference->to(device());
  local->to(device());
  DDPOptions options;
  options.find_unused_parameters = true;
  DistributedDataParallel ddp(local, nullptr, options);
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD opt_ddp(local->parameters(), optim::SGDOptions{0.1, 0.9});
  // step 0: only the last rank uses b; step 1: every rank uses b under no_sync, none in the
  // synchronised backward; step 2: none uses b.
  auto uses_b = [&](int step, int micro, int r) { return step == 0 ? r == world - 1 : step == 1 && micro == 0; };
  int seed = 0;
  for (int step = 0; step < 3; ++step) {
    opt_ref.zero_grad();
    opt_ddp.zero_grad();
    const int micros = step == 1 ? 2 : 1;
    for (int micro = 0; micro < micros; ++micro) {
      Generator gen(500 + seed++);
      Tensor x = randn({world * b, 4}, TensorOptions(DType::Float64), &gen).to(device());
      Tensor y = randint(0, 3, {world * b}, DType::Int64, &gen).to(device());
      for (int r = 0; r < world; ++r) {
        reference->use_b = uses_b(step, micro, r);
        (cross_entropy(reference->forward(x.narrow(0, r * b, b)), y.narrow(0, r * b, b)) * (1.0 / world)).backward();
      }
      local->use_b = uses_b(step, micro, rank);
      std::optional<DistributedDataParallel::NoSync> no_sync;
      if (micro + 1 < micros) no_sync.emplace(ddp);
      cross_entropy(ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
    }
    std::string where;
    if (!close(local->parameters(), reference->parameters(), 0, &where)) fail("before step " + std::to_string(step));
    auto grads = [](nn::Module& m) {
      std::vector<Tensor> g;
      for (const Tensor& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad() : zeros(p.shape(), DType::Float64));
      return g;
    };
    if (!close(grads(*local), grads(*reference), 1e-12, &where)) fail("gradients of step " + std::to_string(step) + ": " + where);
    if (local->child("c").param("weight").grad().defined()) fail("the weight no rank used got a gradient");
    opt_ref.step();
    opt_ddp.step();
  }
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Rank 1 builds a different model: every rank must fail naming the parameter and the ranks.
int scenario_mismatch() {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(20)});
  Generator gen(5);
  auto model = std::make_shared<nn::MLP>(get_rank() == 1 ? 9 : 8, std::vector<int64_t>{6}, 3, 0.0, &gen);
  try {
    DistributedDataParallel ddp(model);
    fail("different models were accepted");
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << std::endl;
  }
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Rank 0's initial weights reach every rank, whatever each one drew.
int scenario_broadcast() {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(20)});
  Generator gen(100 + get_rank());
  auto model = std::make_shared<nn::MLP>(8, std::vector<int64_t>{6}, 3, 0.0, &gen);
  DistributedDataParallel ddp(model);
  Generator rank0(100);
  nn::MLP expected(8, {6}, 3, 0.0, &rank0);
  std::string where;
  if (!close(model->parameters(), expected.parameters(), 0, &where)) fail("rank 0's weights did not arrive: " + where);
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

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

//   ddp_worker elastic stop OPTIMIZER CHECKPOINT
//   ddp_worker elastic resume OPTIMIZER CHECKPOINT RANKS_BEFORE
int scenario_elastic(const std::string& phase, const std::string& optimizer, const std::string& checkpoint,
                     int ranks_before) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int world = get_world_size(), world_before = phase == "stop" ? world : ranks_before;
  ElasticSetup s = elastic_setup(optimizer);
  data::DataLoaderOptions loader;
  loader.batch_size = kElasticBatch;
  loader.shuffle = true;
  loader.seed = kElasticSeed;
  train::DistributedStrategyOptions strategy;
  strategy.device = device();
  strategy.ddp.bucket_cap_mb = 0.02;
  strategy.ddp.first_bucket_mb = 0.005;
  train::TrainLoopOptions options;
  options.strategy = std::make_shared<train::DistributedStrategy>(strategy);
  options.checkpoint_path = checkpoint;
  options.checkpoint_every = kElasticEvery;
  options.progress = false;
  std::ostringstream log;
  options.log = &log;
  train::TrainLoop loop(s.model, std::make_shared<data::DataLoader>(s.dataset, loader), nullptr, nullptr, s.optimizer,
                        [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }, options);
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
  auto order = [](int epoch) {
    Generator gen(kElasticSeed + epoch);
    return randperm(kElasticSamples, DType::Int64, &gen).to_vector<int64_t>();
  };
  std::vector<double> loss_means;
  ElasticSetup ref = elastic_setup(optimizer), unchanged = elastic_setup(optimizer);
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

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  const std::string arg1 = argc > 2 ? argv[2] : "", arg2 = argc > 3 ? argv[3] : "";
  try {
    if (scenario == "equivalence") return scenario_equivalence(arg1, arg2, argc > 4 && std::string(argv[4]) == "views");
    if (scenario == "no_sync") return scenario_no_sync();
    if (scenario == "unused") return scenario_unused(arg1 == "find");
    if (scenario == "partial_use") return scenario_partial_use();
    if (scenario == "mismatch") return scenario_mismatch();
    if (scenario == "broadcast") return scenario_broadcast();
    if (scenario == "elastic" && argc > 4)
      return scenario_elastic(arg1, arg2, argv[4], argc > 5 ? std::stoi(argv[5]) : 0);
  } catch (const std::exception& e) {
    std::cout << "FAIL: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << "ddp_worker: unknown scenario '" << scenario << "'\n";
  return 2;
}
