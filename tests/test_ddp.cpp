// DistributedDataParallel: ranks as processes over loopback (Gloo), each checking its replica
// against single-process training on the whole batch (tests/ddp_worker.cpp); bucket
// assignment and rebuilding in one process.
//
// Note: BatchNorm in training mode normalises each rank's batch with that batch's
// statistics, so DDP matches one process on the whole batch only with BatchNorm in
// evaluation mode (PyTorch's DDP likewise; SyncBatchNorm is its answer): the ResNet case
// runs in evaluation mode.
#include "test_util.h"

#include <filesystem>
#include <tuple>
#include <unistd.h>

#include "parallel/distributed.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/file_store.h"
#include "parallel/process_group_gloo.h"
#include "spawn_ranks.h"

using namespace weft;
using doctest::Contains;

namespace {

const std::string worker = WEFT_DDP_WORKER;

bool skip_without_gloo() {
  if (parallel::gloo_available()) return false;
  MESSAGE("skipped: weft was built without Gloo");
  return true;
}

// A group of one process, through a store file of its own.
std::shared_ptr<parallel::ProcessGroup> solo_group() {
  const auto path = std::filesystem::temp_directory_path() / ("weft_ddp_solo_" + std::to_string(::getpid()) + "_" +
                                                              std::to_string(std::rand()));
  auto store = std::make_shared<parallel::FileStore>(path.string(), std::chrono::seconds(10));
  auto group = parallel::new_group_from_store("gloo", store, 0, 1, std::chrono::seconds(10));
  std::filesystem::remove(path);
  return group;
}

}  // namespace

TEST_CASE("DDP over 2 and 3 ranks equals one process on the whole batch: MLP, ConvNet, ResNet, SGD and Adam") {
  if (skip_without_gloo()) return;
  for (int world : {2, 3}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "equivalence", "mlp", "sgd"}, world, std::chrono::seconds(120)));
    test::check_all_ok(test::run_ranks({worker, "equivalence", "mlp", "adam"}, world, std::chrono::seconds(120)));
  }
  test::check_all_ok(test::run_ranks({worker, "equivalence", "mlp", "sgd", "views"}, 2, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "equivalence", "convnet", "sgd"}, 2, std::chrono::seconds(180)));
  test::check_all_ok(test::run_ranks({worker, "equivalence", "resnet", "adam"}, 3, std::chrono::seconds(180)));
}

TEST_CASE("DDP: no_sync accumulates locally; the next synchronised backward reduces the sum") {
  if (skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "no_sync"}, 3, std::chrono::seconds(120)));
}

TEST_CASE("DDP: unused parameters work with find_unused_parameters and are named without it") {
  if (skip_without_gloo()) return;
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
  if (skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "partial_use"}, 2, std::chrono::seconds(60)));
  test::check_all_ok(test::run_ranks({worker, "partial_use"}, 3, std::chrono::seconds(60)));
}

TEST_CASE("DDP: different models on different ranks fail on every rank, naming the parameter and the ranks") {
  if (skip_without_gloo()) return;
  auto outcomes = test::run_ranks({worker, "mismatch"}, 3, std::chrono::seconds(60));
  test::check_all_ok(outcomes);
  for (const auto& o : outcomes)
    CHECK_MESSAGE(o.output.find("the ranks' models differ: on rank 0, parameter 'layers.0.weight' is float32 [6, 8]; on "
                                "rank 1, parameter 'layers.0.weight' is float32 [6, 9]") != std::string::npos,
                  o.output);
}

TEST_CASE("DDP: every replica starts from rank 0's weights") {
  if (skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "broadcast"}, 3, std::chrono::seconds(60)));
}

TEST_CASE("a ddp TrainLoop resumed mid-epoch on another world size equals one process on the same positions") {
  if (skip_without_gloo()) return;
  // Note [Elastic resume equivalence] in tests/ddp_worker.cpp: growing and shrinking, with
  // padding (100 samples) and a short last step, SGD with momentum and Adam.
  const std::vector<std::tuple<int, int, std::string>> cases = {{2, 3, "sgd"}, {3, 2, "adam"}, {2, 1, "sgd"}};
  for (const auto& [before, after, optimizer] : cases) {
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

TEST_CASE("assign_buckets: readiness order, one dtype and device per bucket, a small first bucket") {
  std::vector<Tensor> params = {zeros({100}), zeros({100}), zeros({50}, DType::Float64), zeros({300}), zeros({10}),
                                zeros({100}, TensorOptions(DType::Float32, Device("cpu:1")))};
  // float32 on cpu:0: 400, 400, 1200, 40 bytes; float64: 400; float32 on cpu:1: 400.
  auto buckets = parallel::assign_buckets(params, {5, 4, 3, 2, 1, 0}, 500, 1000);
  // 5 opens the cpu:1 bucket, 4 the cpu:0 one; 3 would take it past the first cap (500), so
  // {4} closes first; 2 opens the float64 one; 1 would take {3} past 1000, so {3} closes;
  // 0 joins {1}. The buckets still open close in the order they were opened.
  std::vector<std::vector<size_t>> expected = {{4}, {3}, {5}, {1, 0}, {2}};
  CHECK(buckets == expected);
  CHECK_THROWS_WITH_AS(parallel::assign_buckets(params, {0, 1, 2}, 500, 1000), Contains("lists 3 parameters, not 6"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::assign_buckets(params, {0, 1, 2, 3, 4, 4}, 500, 1000), Contains("not a permutation"),
                       Error);
}

TEST_CASE("Reducer: buckets start in reverse registration order and are rebuilt in the order gradients arrived") {
  if (skip_without_gloo()) return;
  auto group = solo_group();
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
