// DistributedDataParallel: ranks as processes over loopback (Gloo), each checking its replica
// against single-process training on the whole batch (ddp_worker.cpp); bucket
// assignment and rebuilding in one process; SyncBatchNorm; a ddp TrainLoop resumed on another
// world size (ddp_worker_training.cpp).
//
// Note: BatchNorm2d in training mode normalises each rank's batch with that batch's
// statistics, so plain DDP matches one process on the whole batch only with BatchNorm in
// evaluation mode (PyTorch's DDP likewise): the ResNet equivalence case runs in evaluation
// mode, and the SyncBatchNorm cases show training mode matching once the layers are converted.
#include "test_util.h"

#include <algorithm>
#include <filesystem>
#include <tuple>
#include <unistd.h>

#include "gloo_suite.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "parallel/ddp/comm_hook_registry.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/ddp/post_localsgd_hook.h"
#include "parallel/ddp/powersgd_hook.h"
#include "parallel/ddp/sync_batch_norm.h"
#include "parallel/optim/model_averaging.h"
#include "parallel/optim/post_localsgd_optimizer.h"
#include "parallel/optim/zero_redundancy_optimizer.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/join.h"
#include "parallel/process_group/process_group_gloo.h"
#include "spawn_ranks.h"
#include "train/distributed_strategy.h"

using namespace weft;
using doctest::Contains;

namespace {

const std::string worker = WEFT_DDP_WORKER;


}  // namespace

TEST_CASE("DDP over 2 and 3 ranks equals one process on the whole batch: MLP, ConvNet, ResNet, GPT, SGD, Adam "
          "and AdamW with decay groups") {
  if (test::skip_without_gloo()) return;
  for (int world : {2, 3}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "equivalence", "mlp", "sgd"}, world, std::chrono::seconds(120)));
    test::check_all_ok(test::run_ranks({worker, "equivalence", "mlp", "adam"}, world, std::chrono::seconds(120)));
  }
  test::check_all_ok(test::run_ranks({worker, "equivalence", "mlp", "sgd", "views"}, 2, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "equivalence", "convnet", "sgd"}, 2, std::chrono::seconds(180)));
  test::check_all_ok(test::run_ranks({worker, "equivalence", "resnet", "adam"}, 3, std::chrono::seconds(180)));
  test::check_all_ok(test::run_ranks({worker, "equivalence", "gpt", "adamw-groups"}, 2, std::chrono::seconds(120)));
}

TEST_CASE("DDP communication hooks: fp16 and bf16 compression round each gradient as they say, and still train") {
  if (test::skip_without_gloo()) return;
  // Two ranks: each averaged gradient is exactly round(c_0 + c_1); three: within the roundings' bound.
  for (int world : {2, 3}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "comm_hook", "fp16"}, world, std::chrono::seconds(120)));
    test::check_all_ok(test::run_ranks({worker, "comm_hook", "bf16"}, world, std::chrono::seconds(120)));
  }
  test::check_all_ok(test::run_ranks({worker, "comm_hook", "fp16", "views"}, 3, std::chrono::seconds(120)));
  // weft's ring all-reduce sums 16-bit values as Gloo does: rounded once per addition.
  test::check_all_ok(test::run_ranks({worker, "comm_hook", "bf16"}, 2, std::chrono::seconds(120),
                                     {{"WEFT_ALL_REDUCE", "ring"}}));
  test::check_all_ok(test::run_ranks({worker, "comm_hook", "allreduce"}, 2, std::chrono::seconds(120)));
}

TEST_CASE("PowerSGD: each compressed gradient is a rank-1 projection of the average plus the carried error; at "
          "full rank with a fresh Q, the average") {
  if (test::skip_without_gloo()) return;
  // Note [What PowerSGD gives] in ddp_worker_hooks.cpp. Rank 1 with error feedback and
  // warm start (2 and 3 ranks, the same 6 samples a step); ranks that cover the average's rank
  // with a fresh Q each step: the exact average, so one process's training.
  test::check_all_ok(test::run_ranks({worker, "powersgd", "1", "3"}, 2, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "powersgd", "1", "2"}, 3, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "powersgd", "2", "1"}, 2, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "powersgd", "3", "1"}, 3, std::chrono::seconds(120)));
}

TEST_CASE("PowerSGDState: options that cannot work are errors that say why") {
  using parallel::PowerSGDOptions;
  using parallel::PowerSGDState;
  CHECK_THROWS_WITH_AS(PowerSGDState(PowerSGDOptions{.rank = 0}), Contains("rank must be at least 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(PowerSGDState(PowerSGDOptions{.start_iteration = 1}),
                       Contains("start_iteration must be at least 2 with error feedback or warm start (got 1): "
                                "DistributedDataParallel rebuilds its buckets after the first iteration"),
                       Error);
  CHECK_NOTHROW(PowerSGDState(PowerSGDOptions{.start_iteration = 0, .use_error_feedback = false, .warm_start = false}));
  CHECK_THROWS_WITH_AS(PowerSGDState(PowerSGDOptions{.min_compression_rate = 0.5}),
                       Contains("min_compression_rate must be at least 1, got 0.5"), Error);
  CHECK_THROWS_WITH_AS(parallel::powersgd_hook(nullptr), Contains("powersgd_hook: the state is null"), Error);
}

TEST_CASE("PowerSGD in a group of one: a rank-1 gradient comes back whole, a zero one as zeros, not NaN") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  Generator gen(4);
  const TensorOptions f64(DType::Float64);
  const Tensor u = randn({8, 1}, f64, &gen), v = randn({1, 6}, f64, &gen);
  for (bool zero : {false, true}) {
    CAPTURE(zero);
    auto state = std::make_shared<parallel::PowerSGDState>(parallel::PowerSGDOptions{.start_iteration = 2});
    parallel::CommHook hook = parallel::powersgd_hook(state);
    // One bucket: an 8 x 6 weight (compressed at rank 1: 14 numbers for 48) and a bias of 8.
    Tensor buffer = empty({56}, f64);
    parallel::GradBucket bucket{.index = 0, .is_last = true, .buffer = buffer,
                                .gradients = {buffer.narrow(0, 0, 48).view({8, 6}), buffer.narrow(0, 48, 8)}};
    const Tensor weight = zero ? zeros({8, 6}, f64) : mm(u, v), bias = randn({8}, f64, &gen);
    for (int step = 0; step < 3; ++step) {  // exact, exact, then compressed
      bucket.gradients[0].copy_(weight);
      bucket.gradients[1].copy_(bias);
      hook(*group, bucket)->wait();
      CHECK(state->iteration() == step + 1);
      const auto got = bucket.gradients[0].to_vector<double>(), expected = weight.to_vector<double>();
      for (size_t k = 0; k < got.size(); ++k) REQUIRE(std::fabs(got[k] - expected[k]) <= 1e-12);  // NaN fails
      CHECK(bucket.gradients[1].to_vector<double>() == bias.to_vector<double>());
    }
    CHECK(state->elements_before() == 56);  // the one compressed call
    CHECK(state->elements_after() == 14 + 8);
  }
}

TEST_CASE("comm_hook_named and then(): the continuation runs once, after the work; an error in it is the work's") {
  CHECK_THROWS_WITH_AS(parallel::comm_hook_named("topk"),
                       Contains("unknown communication hook 'topk' (weft has allreduce, fp16, bf16 and powersgd)"),
                       Error);
  CHECK(parallel::comm_hook_named("powersgd") != nullptr);
  // A work that is done when the test says so.
  struct Manual final : parallel::Work {
    bool done = false;
    void wait(std::chrono::milliseconds) override { done = true; }
    bool is_completed() override { return done; }
    std::exception_ptr exception() override { return nullptr; }
  };
  auto inner = std::make_shared<Manual>();
  int runs = 0;
  auto work = parallel::then(inner, [&] { ++runs; });
  CHECK_FALSE(work->is_completed());
  CHECK(runs == 0);
  inner->done = true;
  CHECK(work->is_completed());  // finds it done: runs the continuation
  CHECK(runs == 1);
  work->wait();
  CHECK(runs == 1);
  auto failing = parallel::then(std::make_shared<Manual>(), [] { throw Error("widening failed"); });
  CHECK_THROWS_WITH_AS(failing->wait(), Contains("widening failed"), Error);
  CHECK(failing->exception() != nullptr);
  CHECK_THROWS_WITH_AS(failing->wait(), Contains("widening failed"), Error);  // once, and remembered
}

TEST_CASE("DDP: no_sync accumulates locally; the next synchronised backward reduces the sum") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "no_sync"}, 3, std::chrono::seconds(120)));
}

TEST_CASE("DDP: unused parameters work with find_unused_parameters and are named without it") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "unused", "find"}, 2, std::chrono::seconds(60)));
  auto outcomes = test::run_ranks({worker, "unused", "strict"}, 2, std::chrono::seconds(60));
  test::check_all_ok(outcomes);
  for (const auto& o : outcomes) {
    CHECK_MESSAGE(o.output.find("parameter(s) 'unused.weight', 'unused.bias' received no gradient") != std::string::npos,
                  o.output);
    CHECK(o.output.find("find_unused_parameters = true") != std::string::npos);
  }
}

TEST_CASE("DDP: find_unused_parameters with parameters used on some ranks, under no_sync only, or on none") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "partial_use"}, 2, std::chrono::seconds(60)));
  test::check_all_ok(test::run_ranks({worker, "partial_use"}, 3, std::chrono::seconds(60)));
}

TEST_CASE("DDP: different models on different ranks fail on every rank, naming the parameter and the ranks") {
  if (test::skip_without_gloo()) return;
  auto outcomes = test::run_ranks({worker, "mismatch"}, 3, std::chrono::seconds(60));
  test::check_all_ok(outcomes);
  for (const auto& o : outcomes)
    CHECK_MESSAGE(o.output.find("the ranks' models differ: on rank 0, parameter 'layers.0.weight' is float32 [6, 8]; on "
                                "rank 1, parameter 'layers.0.weight' is float32 [6, 9]") != std::string::npos,
                  o.output);
}

TEST_CASE("DDP: every replica starts from rank 0's weights") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "broadcast"}, 3, std::chrono::seconds(60)));
}

TEST_CASE("SyncBatchNorm: DDP in training mode equals one process with BatchNorm2d on the whole batch") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "sync_bn", "sgd"}, 2, std::chrono::seconds(180)));
  test::check_all_ok(test::run_ranks({worker, "sync_bn", "adam"}, 3, std::chrono::seconds(180)));
}

TEST_CASE("SyncBatchNorm: ranks with different numbers of samples, one with none, equal one BatchNorm2d") {
  if (test::skip_without_gloo()) return;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "sync_bn_uneven"}, world, std::chrono::seconds(60)));
  }
}

TEST_CASE("a ddp TrainLoop resumed mid-epoch on another world size equals one process on the same positions") {
  if (test::skip_without_gloo()) return;
  // Note [Elastic resume equivalence] in ddp_worker_training.cpp: growing and
  // shrinking, with padding (100 samples) and a short last step, SGD with momentum and Adam,
  // plain and sharded by a ZeroRedundancyOptimizer (the loop consolidates its state on rank 0
  // for each checkpoint; each rank of the resumed job loads its new shard).
  const std::vector<std::tuple<int, int, std::string>> cases = {
      {2, 3, "sgd"}, {3, 2, "adam"}, {2, 1, "sgd"}, {2, 3, "zero-adam"}, {3, 1, "zero-sgd"}};
  for (const auto& entry : cases) {
    const int before = std::get<0>(entry), after = std::get<1>(entry);
    const std::string& optimizer = std::get<2>(entry);
    CAPTURE(before);
    CAPTURE(after);
    const auto checkpoint = std::filesystem::temp_directory_path() /
                            ("weft_ddp_elastic_" + std::to_string(::getpid()) + ".safetensors");
    test::check_all_ok(test::run_ranks({worker, "elastic", "stop", optimizer, checkpoint.string()}, before,
                                       std::chrono::seconds(120)));
    test::check_all_ok(test::run_ranks({worker, "elastic", "resume", optimizer, checkpoint.string(),
                                        std::to_string(before)}, after, std::chrono::seconds(120)));
    std::filesystem::remove(checkpoint);
  }
}

TEST_CASE("a ddp TrainLoop with local SGD, resumed mid-epoch on another world size, equals its replicas in one process") {
  if (test::skip_without_gloo()) return;
  // Note [Local SGD's TrainLoop reference] in ddp_worker_training.cpp: the averages on
  // the schedule, and the replicas (parameters and optimizer state) made one at the
  // checkpoints and epochs' ends, which is what lets the job resume on another world size.
  const std::vector<std::tuple<int, int, std::string>> cases = {{2, 3, "sgd"}, {3, 2, "adam"}};
  for (const auto& c : cases) {
    // Named values, not structured bindings: Clang 14 cannot capture those in CAPTURE's lambda.
    const int before = std::get<0>(c), after = std::get<1>(c);
    const std::string& optimizer = std::get<2>(c);
    CAPTURE(before);
    CAPTURE(after);
    const auto checkpoint = std::filesystem::temp_directory_path() /
                            ("weft_ddp_local_sgd_" + std::to_string(::getpid()) + ".safetensors");
    test::check_all_ok(test::run_ranks({worker, "elastic_local_sgd", "stop", optimizer, checkpoint.string()}, before,
                                       std::chrono::seconds(120)));
    test::check_all_ok(test::run_ranks({worker, "elastic_local_sgd", "resume", optimizer, checkpoint.string(),
                                        std::to_string(before)}, after, std::chrono::seconds(120)));
    std::filesystem::remove(checkpoint);
  }
  // BatchNorm's running statistics, each rank's own with broadcast_buffers off, made one too.
  test::check_all_ok(test::run_ranks({worker, "local_sgd_buffers"}, 2, std::chrono::seconds(120)));
}

TEST_CASE("SyncBatchNorm::convert keeps names, tensors and modes; without peers it is BatchNorm2d") {
  Generator gen(3);
  auto model = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
  model->eval();
  const auto before = model->named_parameters();
  const auto buffers_before = model->named_buffers();
  auto plain = model->clone();
  CHECK(parallel::SyncBatchNorm::convert(model) == model);
  int converted = 0;
  for (const auto& entry : model->named_modules()) {
    const nn::Module* m = entry.second;
    CHECK_MESSAGE(m->type_name() != "BatchNorm2d", entry.first);
    if (m->type_name() == "SyncBatchNorm") {
      ++converted;
      CHECK_FALSE(m->is_training());
      CHECK(dynamic_cast<const nn::BatchNorm2d*>(m) != nullptr);  // still a BatchNorm2d
    }
  }
  CHECK(converted == 9);  // the stem's, two in each of the three blocks, one in each downsample
  const auto after = model->named_parameters();
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].first == before[i].first);
    CHECK(after[i].second.is_same(before[i].second));  // an optimizer made before still holds them
  }
  const auto buffers_after = model->named_buffers();
  REQUIRE(buffers_after.size() == buffers_before.size());
  for (size_t i = 0; i < buffers_after.size(); ++i) CHECK(buffers_after[i].first == buffers_before[i].first);
  CHECK(parallel::SyncBatchNorm::convert(model) == model);  // nothing left to convert
  CHECK(model->clone()->child("bn1").type_name() == "SyncBatchNorm");
  CHECK(model->repr().find("(bn1): SyncBatchNorm(16, eps=1e-05, momentum=0.1") != std::string::npos);

  // No process group, or a group of one: exactly BatchNorm2d, in training mode too.
  for (bool solo : {false, true}) {
    CAPTURE(solo);
    auto layer = parallel::SyncBatchNorm::convert(std::make_shared<nn::BatchNorm2d>(3),
                                                  solo && parallel::gloo_available() ? test::solo_group() : nullptr);
    auto reference = std::make_shared<nn::BatchNorm2d>(3);
    Tensor x = randn({4, 3, 2, 2}, DType::Float32, &gen);
    CHECK(layer->forward(x).to_vector<float>() == reference->forward(x).to_vector<float>());
    CHECK(layer->buffer("running_var").to_vector<float>() == reference->buffer("running_var").to_vector<float>());
  }
  CHECK_THROWS_WITH_AS(parallel::SyncBatchNorm(3).forward(ones({2, 3})),
                       Contains("SyncBatchNorm: expected a 4-d input"), Error);
}

TEST_CASE("the TrainLoop's ddp strategy converts BatchNorm2d layers when asked") {
  if (test::skip_without_gloo()) return;
  const auto path = std::filesystem::temp_directory_path() / ("weft_ddp_strategy_" + std::to_string(::getpid()));
  parallel::init_process_group("gloo", {.init_method = "file://" + path.string(), .rank = 0, .world_size = 1,
                                        .timeout = std::chrono::seconds(10)});
  for (bool sync : {false, true}) {
    CAPTURE(sync);
    Generator gen(5);
    auto model = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
    train::DistributedStrategyOptions options;
    options.sync_batch_norm = sync;
    train::DistributedStrategy strategy(options);
    auto runner = strategy.prepare(model);
    CHECK(runner->type_name() == "DistributedDataParallel");
    CHECK(model->child("bn1").type_name() == (sync ? "SyncBatchNorm" : "BatchNorm2d"));
    CHECK(&runner->child("module") == model.get());
  }
  parallel::destroy_process_group();
  std::filesystem::remove(path);
}

TEST_CASE("the ddp strategy's local SGD: its option checks, its optimizers, its step count through a checkpoint") {
  using train::DistributedStrategy, train::DistributedStrategyOptions;
  if (test::skip_without_gloo()) return;
  CHECK_THROWS_WITH_AS(DistributedStrategy(DistributedStrategyOptions{.local_sgd_warmup = 5}),
                       Contains("local_sgd_warmup 5 without local SGD (local_sgd_period is 0)"), Error);
  CHECK_THROWS_WITH_AS(DistributedStrategy(DistributedStrategyOptions{.local_sgd_period = -1}),
                       Contains("local_sgd_period and local_sgd_warmup must be >= 0, got -1 and 0"), Error);
  CHECK_THROWS_WITH_AS(DistributedStrategy(DistributedStrategyOptions{.comm_hook = "fp16", .local_sgd_period = 2}),
                       Contains("local SGD brings its own communication hook (post-local SGD), so comm_hook 'fp16'"),
                       Error);
  const auto path = std::filesystem::temp_directory_path() / ("weft_ddp_local_sgd_" + std::to_string(::getpid()));
  parallel::init_process_group("gloo", {.init_method = "file://" + path.string(), .rank = 0, .world_size = 1,
                                        .timeout = std::chrono::seconds(10)});
  Generator gen(5);
  data::Batch batch{randn({4, 20}, DType::Float32, &gen), randint(0, 10, {4}, DType::Int64, &gen)};
  const train::Criterion criterion = [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); };
  DistributedStrategy strategy(DistributedStrategyOptions{.local_sgd_period = 2, .local_sgd_warmup = 1});
  auto model = std::make_shared<nn::MLP>(20, std::vector<int64_t>{8}, 10, 0.0, &gen);
  strategy.prepare(model);
  optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1, 0.9});
  for (int i = 0; i < 3; ++i) strategy.train_step(batch, criterion, sgd);
  CHECK(strategy.local_sgd_step() == 3);
  CHECK(strategy.state_dict() == std::map<std::string, double>{{"local_sgd_step", 3}});
  strategy.consolidate_replicas(sgd);  // a group of one is its own average
  strategy.load_state_dict({{"local_sgd_step", 7}});
  CHECK(strategy.local_sgd_step() == 7);
  CHECK_THROWS_WITH_AS(strategy.load_state_dict({{"local_sgd_step", 2.5}}),
                       Contains("strategy.local_sgd_step is 2.5, not a count of steps"), Error);
  strategy.load_state_dict({});  // written without local SGD: the count starts at 0, with a line
  CHECK(strategy.local_sgd_step() == 0);
  // Optimizers that would not let the replicas part, or would average them a second time.
  parallel::ZeroRedundancyOptimizer zero(model->parameters(), [](std::vector<Tensor> shard) {
    return std::make_shared<optim::SGD>(shard, optim::SGDOptions{0.1});
  });
  CHECK_THROWS_WITH_AS(strategy.train_step(batch, criterion, zero),
                       Contains("a ZeroRedundancyOptimizer(SGD) steps one shard per rank"), Error);
  parallel::PostLocalSGDOptimizer wrapped(std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.1}),
                                          std::make_shared<parallel::PeriodicModelAverager>(2));
  CHECK_THROWS_WITH_AS(strategy.train_step(batch, criterion, wrapped),
                       Contains("the strategy averages the replicas itself; give the loop the optimizer the "
                                "PostLocalSGDOptimizer(SGD) wraps"), Error);
  CHECK(zero.step_scope() == optim::StepScope::ShardedAcrossRanks);
  CHECK(wrapped.step_scope() == optim::StepScope::AveragesReplicas);
  // A pipeline's ranks step their own stages: neither wrapper can step them.
  DistributedStrategy piped(
      DistributedStrategyOptions{.plan = {.pp = parallel::ParallelPlan::kRest, .dp_replicate = 1}});
  auto seq = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(20, 10, true, TensorOptions(), &gen));
  piped.prepare(seq);
  CHECK(piped.mode() == train::ParallelMode::Pipeline);
  for (optim::Optimizer* refused : std::vector<optim::Optimizer*>{&zero, &wrapped})
    CHECK_THROWS_WITH_AS(piped.train_step(batch, criterion, *refused),
                         Contains("works across the ranks of data parallelism; in a pipeline each rank steps its own "
                                  "stages"), Error);
  // Without local SGD the strategy keeps nothing and ignores a local-SGD checkpoint's entry.
  DistributedStrategy plain;
  plain.prepare(std::make_shared<nn::MLP>(20, std::vector<int64_t>{8}, 10, 0.0, &gen));
  CHECK(plain.state_dict().empty());
  plain.load_state_dict({{"local_sgd_step", 3}});
  CHECK(plain.local_sgd_step() == 0);
  parallel::destroy_process_group();
  std::filesystem::remove(path);
}

TEST_CASE("DDP join: ranks with different numbers of batches end with the model one process computes for them") {
  if (test::skip_without_gloo()) return;
  // Note [The join's reference] in ddp_worker_join.cpp. Rank r has COUNTS[r] batches.
  const std::vector<std::vector<std::string>> cases = {
      {"mlp", "sgd", "4,1,3"},            // one runs out early, one a step before the last
      {"mlp", "sgd", "2,2"},              // even: nothing to shadow
      {"mlp", "adam", "0,2,3", "active"}, // rank 0 has none (the buckets are rebuilt from its order)
      {"bn", "sgd", "2,4,1"},             // BatchNorm's buffers from the highest rank still iterating
      {"unused", "sgd", "3,1"},           // find_unused_parameters
      {"mlp", "sgd", "3,1,2", "micro2"},  // two micro-batches a step, the first under no_sync
      {"mlp", "zero-adam", "1,4,2"},      // ZeroRedundancyOptimizer in the join: the shards go on stepping
      {"mlp", "zero-sgd", "0,3", "active"},
      {"mlp", "zero-sgd", "3,1,2", "micro2"},  // the shards step after the reduced backward only
      {"mlp", "sgd", "1,1,3", "views"},   // two run out together; gradients as bucket views
      {"mlp", "sgd", "3,0,1", "fp16"},    // through a compression hook (the reference within its rounding)
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {worker, "join"};
    argv.insert(argv.end(), c.begin(), c.end());
    CAPTURE(argv);
    const int world = static_cast<int>(std::count(c[2].begin(), c[2].end(), ',')) + 1;
    test::check_all_ok(test::run_ranks(argv, world, std::chrono::seconds(180)));
  }
  // In debug mode every collective's fingerprint is compared across the ranks: a rank that
  // shadows with a different collective would be named, not left waiting.
  test::check_all_ok(test::run_ranks({worker, "join", "unused", "adam", "2,0,3", "active", "micro2"}, 3,
                                     std::chrono::seconds(180), {{"WEFT_DISTRIBUTED_DEBUG", "1"}}));
}

TEST_CASE("DDP join with throw_on_early_termination: every rank stops where the first runs out, naming it") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "join_throw", "3,1,3"}, 3, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "join_throw", "2,0"}, 2, std::chrono::seconds(120)));
}

TEST_CASE("join in a group of one: the body runs inside it; exceptions pass through; misuse is an error that says so") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  Generator gen(9);
  auto model = std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen);
  parallel::DistributedDataParallel ddp(model, group);
  optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1});
  int steps = 0;
  ddp.join([&] {
    CHECK(ddp.in_join());
    for (int s = 0; s < 3; ++s, ++steps) {
      sgd.zero_grad();
      sum(ddp(ones({2, 6}))).backward();
      sgd.step();
    }
  });
  CHECK(steps == 3);
  CHECK_FALSE(ddp.in_join());
  CHECK(ddp.reducer().iterations() == 3);
  // enable = false: the body alone.
  ddp.join([&] { CHECK_FALSE(ddp.in_join()); }, parallel::JoinOptions{.enable = false});
  // An exception leaves the join at once, which is over afterwards.
  CHECK_THROWS_WITH_AS(ddp.join([] { throw std::runtime_error("out of data"); }), "out of data", std::runtime_error);
  CHECK_FALSE(ddp.in_join());
  CHECK_THROWS_WITH_AS(parallel::join({}, [] {}), Contains("no joinables"), Error);
  CHECK_THROWS_WITH_AS(ddp.join([&] { ddp.join([] {}); }), Contains("already inside a join"), Error);
  CHECK_FALSE(ddp.in_join());
  auto other_group = test::solo_group();
  parallel::DistributedDataParallel other(std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen),
                                          other_group);
  CHECK_THROWS_WITH_AS(parallel::join({&ddp, &other}, [] {}), Contains("different process groups"), Error);
  parallel::ZeroRedundancyOptimizer zero(
      model->parameters(),
      [](std::vector<Tensor> shard) { return std::make_shared<optim::SGD>(shard, optim::SGDOptions{0.1}); },
      group);
  CHECK_THROWS_WITH_AS(parallel::join({&zero, &ddp}, [] {}), Contains("needs the DDP module first"), Error);
  CHECK_THROWS_WITH_AS(parallel::join({&ddp, &zero, &ddp}, [] {}), Contains("joinable 2 is listed twice"), Error);
  parallel::DistributedDataParallel second(std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen), group);
  CHECK_THROWS_WITH_AS(parallel::join({&ddp, &second}, [] {}), Contains("one DDP module per join"), Error);
  CHECK_FALSE(ddp.in_join());
  parallel::join({&ddp, &zero}, [&] {
    sum(ddp(ones({2, 6}))).backward();
    zero.step();
  }, {.divide_by_initial_world_size = false});
  CHECK_FALSE(zero.in_join());
}

TEST_CASE("local SGD: DDP with the post-local SGD hook and a model averager equals one process keeping a replica per "
          "rank") {
  if (test::skip_without_gloo()) return;
  // Note [Local SGD's reference] in ddp_worker_local_sgd.cpp. Arguments: optimizer,
  // start_iteration (= the averager's warm-up), averager (a period, or period:group size
  // levels), the subgroup that averages gradients after the warm-up ("none": no all-reduce;
  // "machine:2": the default, one per machine of LOCAL_WORLD_SIZE = 2 ranks), flags.
  const auto limit = std::chrono::seconds(120);
  test::check_all_ok(test::run_ranks({worker, "local_sgd", "sgd", "3", "4", "none"}, 2, limit));
  test::check_all_ok(test::run_ranks({worker, "local_sgd", "adam", "2", "3", "2"}, 4, limit));
  test::check_all_ok(test::run_ranks({worker, "local_sgd", "sgd", "2", "2:2,4:4", "none"}, 4, limit));
  test::check_all_ok(test::run_ranks({worker, "local_sgd", "sgd", "0", "2", "none", "views"}, 3, limit));
  test::check_all_ok(test::run_ranks({worker, "local_sgd", "sgd", "2", "3", "machine:2", "micro2"}, 4, limit));
}

TEST_CASE("model averagers: their schedules, their checks, and PostLocalSGDOptimizer's state") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  parallel::PeriodicModelAverager periodic(3, 2, group);
  std::vector<int64_t> averaging;
  for (int64_t s = 0; s < 10; ++s)
    if (periodic.averages_at(s)) averaging.push_back(s);
  CHECK(averaging == std::vector<int64_t>{2, 5, 8});
  CHECK_THROWS_WITH_AS(parallel::PeriodicModelAverager(0, 0, group), Contains("period must be >= 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(parallel::PeriodicModelAverager(2, -1, group), Contains("warmup_steps must be >= 0, got -1"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::PostLocalSGDState({.start_iteration = -2}),
                       Contains("start_iteration must be >= 0, got -2"), Error);
  CHECK_THROWS_WITH_AS(parallel::PostLocalSGDState({.subgroup = nullptr}), Contains("the subgroup given is null"),
                       Error);
  CHECK_THROWS_WITH_AS(
      parallel::PostLocalSGDOptimizer(nullptr, std::make_shared<parallel::PeriodicModelAverager>(1, 0, group)),
      Contains("needs an optimizer to wrap"), Error);
  // average_gradients: a parameter without a gradient is named, even over a group of one.
  Tensor with_grad = ones({3}).requires_grad_(), without = ones({2, 2}).requires_grad_();
  sum(with_grad).backward();
  CHECK_NOTHROW(parallel::average_gradients({with_grad}, *group));
  CHECK_THROWS_WITH_AS(parallel::average_gradients({with_grad, without}, *group),
                       Contains("average_gradients: parameter 1 ([2, 2]) has no gradient"), Error);
  // On a rank outside its group (new_group's null) an averager only counts.
  parallel::PeriodicModelAverager outside(1, 0, std::shared_ptr<parallel::ProcessGroup>());
  outside.average_parameters({ones({2})});
  CHECK(outside.step() == 1);

  // Over a group of one the averages change nothing: the wrapper steps as the plain optimizer.
  Generator gen(5);
  auto model = std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen);
  auto twin = std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen);
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) twin->parameters()[i].copy_(model->parameters()[i]);
  }
  parallel::DistributedDataParallel ddp(model, group);
  ddp.register_comm_hook(parallel::post_localsgd_hook(std::make_shared<parallel::PostLocalSGDState>(
      parallel::PostLocalSGDOptions{.start_iteration = 1, .post_local_gradient_allreduce = false})));
  auto averager = std::make_shared<parallel::PeriodicModelAverager>(2, 1, group);
  parallel::PostLocalSGDOptimizer opt(std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.1, 0.9}),
                                      averager);
  CHECK(opt.name() == "PostLocalSGDOptimizer(SGD)");
  optim::SGD plain(twin->parameters(), optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < 4; ++s) {
    opt.zero_grad();
    sum(ddp(full({3, 6}, 0.5 + s))).backward();
    opt.step();
    plain.zero_grad();
    sum(twin->forward(full({3, 6}, 0.5 + s))).backward();
    plain.step();
  }
  for (size_t i = 0; i < model->parameters().size(); ++i)
    CHECK(amax(abs(sub(model->parameters()[i], twin->parameters()[i]))).item<double>() == 0);
  CHECK(averager->step() == 4);
  opt.set_lr(0.05);
  auto state = opt.state_dict();
  CHECK(state.scalars.at("averager_step") == 4);
  CHECK(state.scalars.at("lr") == 0.05);

  // Resume: the count comes back; a plain optimizer's state starts it at 0; a bad count is refused.
  auto resumed_averager = std::make_shared<parallel::PeriodicModelAverager>(2, 1, group);
  parallel::PostLocalSGDOptimizer resumed(
      std::make_shared<optim::SGD>(twin->parameters(), optim::SGDOptions{0.1, 0.9}), resumed_averager);
  resumed.load_state_dict(state);
  CHECK(resumed_averager->step() == 4);
  CHECK(resumed.lr() == 0.05);
  resumed.load_state_dict(plain.state_dict());
  CHECK(resumed_averager->step() == 0);
  auto bad = state;
  bad.scalars["averager_step"] = -1;
  CHECK_THROWS_WITH_AS(resumed.load_state_dict(bad), Contains("'averager_step' must be a non-negative whole number"),
                       Error);
  CHECK_THROWS_WITH_AS(plain.load_state_dict(state), Contains("unexpected averager_step"), Error);

  // A scheduler on either side owns the rate; on both, to different rates, is an error.
  resumed.optimizer().set_lr(0.02);
  CHECK(resumed.state_dict().scalars.at("lr") == 0.02);
  resumed.zero_grad();
  sum(twin->forward(ones({1, 6}))).backward();
  resumed.step();
  CHECK(resumed.lr() == 0.02);
  resumed.set_lr(0.03);
  resumed.optimizer().set_lr(0.04);
  CHECK_THROWS_WITH_AS(resumed.step(), Contains("set to 0.03 on the wrapper and to 0.04 on the wrapped SGD"), Error);

  // Local SGD inside a join is refused where it starts (the warm-up's global averages are fine).
  auto state_in_join = std::make_shared<parallel::PostLocalSGDState>(
      parallel::PostLocalSGDOptions{.start_iteration = 1, .post_local_gradient_allreduce = false});
  parallel::DistributedDataParallel joined(twin, group);
  joined.register_comm_hook(parallel::post_localsgd_hook(state_in_join));
  int backwards = 0;
  CHECK_THROWS_WITH_AS(joined.join([&] {
    for (; backwards < 3; ++backwards) sum(joined(ones({1, 6}))).backward();
  }), Contains("local SGD cannot run inside a join (iteration 1, after the warm-up of 1)"), Error);
  CHECK(backwards == 1);
  state_in_join->set_iteration(0);
  CHECK_FALSE(state_in_join->local());

  // Sub-groups and the hierarchical averager need the default group.
  const auto path = std::filesystem::temp_directory_path() / ("weft_local_sgd_" + std::to_string(::getpid()));
  parallel::init_process_group("gloo", {.init_method = "file://" + path.string(), .rank = 0, .world_size = 1,
                                        .timeout = std::chrono::seconds(10)});
  CHECK(parallel::new_subgroups(1)->size() == 1);
  CHECK_THROWS_WITH_AS(parallel::new_subgroups(2), Contains("a group size of 2 does not divide the default group's 1 "
                                                            "ranks"), Error);
  if (!parallel::launched_as_rank())
    CHECK_THROWS_WITH_AS(parallel::new_subgroups(), Contains("give the group size"), Error);
  parallel::HierarchicalModelAverager hierarchical({{2, 1}, {6, 1}}, 1);
  std::vector<int> sizes;
  for (int64_t s = 0; s < 7; ++s) sizes.push_back(hierarchical.group_size_at(s));
  CHECK(sizes == std::vector<int>{0, 0, 1, 0, 1, 0, 1});
  using Levels = std::vector<std::pair<int64_t, int>>;
  CHECK_THROWS_WITH_AS(parallel::HierarchicalModelAverager(Levels{}), Contains("needs at least one"), Error);
  CHECK_THROWS_WITH_AS(parallel::HierarchicalModelAverager(Levels{{4, 1}, {2, 1}}),
                       Contains("the periods must increase, but 2 follows 4"), Error);
  CHECK_THROWS_WITH_AS(parallel::HierarchicalModelAverager(Levels{{0, 1}}), Contains("period 0 must be >= 1"), Error);
  CHECK_THROWS_WITH_AS(parallel::HierarchicalModelAverager(Levels{{2, 2}}),
                       Contains("a group size of 2 (period 2) does not divide the 1 ranks"), Error);
  parallel::destroy_process_group();
  std::filesystem::remove(path);
}

TEST_CASE("assign_buckets: readiness order, one dtype and device per bucket, a small first bucket") {
  std::vector<Tensor> params = {zeros({100}), zeros({100}), zeros({50}, DType::Float64), zeros({300}), zeros({10}),
                                zeros({100}, TensorOptions(DType::Float32, Device("cpu:1")))};
  // float32 on cpu:0: 400, 400, 1200, 40 bytes; float64: 400; float32 on cpu:1: 400.
  auto buckets = parallel::assign_buckets(params, {5, 4, 3, 2, 1, 0}, 500, 1000);
  // As PyTorch's DDP: 5 opens the cpu:1 bucket, 4 the cpu:0 one; 3 takes that one past its
  // first cap (500), so {4, 3} closes first; 2 opens the float64 one; 1 and 0 (800 bytes) stay
  // under the cap of the cpu:0 buckets after their first (1000). The buckets still open close
  // in the order they were opened.
  std::vector<std::vector<size_t>> expected = {{4, 3}, {5}, {1, 0}, {2}};
  CHECK(buckets == expected);
  // Each dtype and device's first bucket has the small cap: the float64 one closes at 800
  // bytes although a float32 bucket closed before it.
  std::vector<Tensor> mixed = {zeros({200}), zeros({50}, DType::Float64), zeros({50}, DType::Float64),
                               zeros({50}, DType::Float64)};
  CHECK(parallel::assign_buckets(mixed, {0, 1, 2, 3}, 500, 1000) == std::vector<std::vector<size_t>>{{0}, {1, 2}, {3}});
  CHECK_THROWS_WITH_AS(parallel::assign_buckets(params, {0, 1, 2}, 500, 1000), Contains("lists 3 parameters, not 6"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::assign_buckets(params, {0, 1, 2, 3, 4, 4}, 500, 1000), Contains("not a permutation"),
                       Error);
}

TEST_CASE("Reducer: finish_at_end_of_backward = false leaves the buckets to finish(), as a pipeline's stage needs") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  Generator gen(9);
  auto model = std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen);
  std::vector<std::string> names;
  for (const auto& [name, p] : model->named_parameters()) names.push_back(name);
  parallel::Reducer reducer(model->parameters(), names, group,
                            {.bucket_cap_bytes = 100, .first_bucket_cap_bytes = 10,
                             .finish_at_end_of_backward = false, .owner = "the stage's average"});
  // A hook that doubles each bucket where the all-reduce would average it, and counts them.
  int launched = 0;
  reducer.set_comm_hook([&](parallel::ProcessGroup&, const parallel::GradBucket& bucket) {
    mul_(bucket.buffer, 2.0);
    ++launched;
    return parallel::completed_work();
  });
  CHECK_THROWS_WITH_AS(reducer.finish(), Contains("the stage's average (rank 0): Reducer::finish() without "
                                                  "prepare_for_backward"), Error);
  // Gradients accumulated before the reducer is armed (a stage's earlier micro-batches) are
  // reduced with those of the backward it is armed for: their sum, doubled by the hook.
  sum(model->forward(ones({2, 6}))).backward();
  CHECK(launched == 0);
  reducer.prepare_for_backward({});
  sum(model->forward(full({3, 6}, 0.5))).backward();
  CHECK(launched == static_cast<int>(reducer.buckets().size()));  // launched during the backward
  CHECK(reducer.buckets().size() > 1);
  CHECK(reducer.expecting_gradients());  // but the end of backward finished nothing
  CHECK(reducer.iterations() == 0);
  std::vector<Tensor> accumulated;
  for (const Tensor& p : model->parameters()) accumulated.push_back(p.grad().clone());
  reducer.finish();
  CHECK_FALSE(reducer.expecting_gradients());
  CHECK(reducer.iterations() == 1);
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK_CLOSE(params[i].grad(), mul(accumulated[i], 2.0), 0, 0);
  // A backward that is not followed by finish() leaves the next one out of step, and says so.
  reducer.prepare_for_backward({});
  sum(model->forward(ones({2, 6}))).backward();
  CHECK_THROWS_WITH_AS(reducer.prepare_for_backward({}),
                       Contains("the stage's average (rank 0): the previous backward failed before it finished (or "
                                "was not followed by finish())"),
                       Error);
  parallel::Reducer plain(model->parameters(), names, group, {});
  CHECK_THROWS_WITH_AS(plain.finish(), Contains("finish() is for a reducer made with finish_at_end_of_backward = "
                                                "false"), Error);
}

TEST_CASE("Reducer: buckets start in reverse registration order and are rebuilt in the order gradients arrived") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  Generator gen(9);
  auto model = std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 4, 0.0, &gen);
  parallel::DDPOptions options;
  options.bucket_cap_mb = 1e-4;  // about 100 bytes: several buckets
  options.first_bucket_mb = 1e-5;
  parallel::DistributedDataParallel ddp(model, group, options);
  const auto params = model->parameters();
  std::vector<size_t> reverse;
  for (size_t i = params.size(); i-- > 0;) reverse.push_back(i);
  CHECK(ddp.reducer().buckets() == parallel::assign_buckets(params, reverse, 10, 104));
  sum(ddp(ones({2, 6}))).backward();
  CHECK(ddp.reducer().iterations() == 1);
  const auto& arrived = ddp.reducer().arrival_order();
  CHECK(arrived.size() == params.size());
  CHECK(ddp.reducer().buckets() == parallel::assign_buckets(params, arrived, 10, 104));
  for (const Tensor& p : params) CHECK(p.grad().defined());
  // Another backward without a forward through DDP reduces nothing (and says nothing).
  sum(model->forward(ones({1, 6}))).backward();
  CHECK(ddp.reducer().iterations() == 1);
}
