// Balancing a pipeline's stages by cost (parallel/pipeline/balance.h): balance_by_cost against
// every possible split, its ties against the split by layer count, layer_times leaving the
// model as it was, a layer sixty times dearer than the rest given a stage of its own,
// the pipelines' balance_by, and rank 0's measurement reaching every rank of a
// DistributedPipeline (ranks started as processes, pipeline_worker.cpp).
#include "test_util.h"

#include <algorithm>
#include <functional>
#include <tuple>

#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/models/resnet.h"
#include "nn/sequential.h"
#include "parallel/pipeline/balance.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/process_group/process_group_gloo.h"
#include "pipeline_models.h"
#include "spawn_ranks.h"

using namespace weft;
using namespace weft::parallel::pipeline;
using doctest::Contains;

namespace {

// Every split of n layers into `stages` non-empty runs.
void for_each_split(size_t n, int stages, std::vector<size_t>& prefix,
                    const std::function<void(const std::vector<size_t>&)>& f) {
  if (stages == 1) {
    prefix.push_back(n);
    f(prefix);
    prefix.pop_back();
    return;
  }
  for (size_t first = 1; first + static_cast<size_t>(stages) - 1 <= n; ++first) {
    prefix.push_back(first);
    for_each_split(n - first, stages - 1, prefix, f);
    prefix.pop_back();
  }
}

// The split balance_by_cost promises, found by trying them all: the least largest stage, then
// the least sum of squared stage costs, then the shortest last stage, the shortest one before it...
std::vector<size_t> best_by_brute_force(const std::vector<double>& costs, int stages) {
  auto key = [&](const std::vector<size_t>& balance) {
    double largest = 0, squares = 0;
    size_t next = 0;
    for (size_t count : balance) {
      double sum = 0;
      for (size_t i = 0; i < count; ++i) sum += costs[next++];
      largest = std::max(largest, sum);
      squares += sum * sum;
    }
    return std::tuple(largest, squares, std::vector<size_t>(balance.rbegin(), balance.rend()));
  };
  std::vector<size_t> best, prefix;
  for_each_split(costs.size(), stages, prefix, [&](const std::vector<size_t>& balance) {
    if (best.empty() || key(balance) < key(best)) best = balance;
  });
  return best;
}

std::shared_ptr<nn::Sequential> small_resnet() {
  auto resnet = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1});
  resnet->to(DType::Float64);
  return resnet->as_sequential();
}

}  // namespace

TEST_CASE("balance_by_cost: the least largest stage of every split, and the layer-count split for equal costs") {
  CHECK(balance_by_cost({1, 10, 1, 1}, 2) == std::vector<size_t>{2, 2});
  CHECK(balance_by_cost({3.6, 10.0, 0.01, 0.1}, 2) == std::vector<size_t>{1, 3});  // the ConvNet's shape
  CHECK(balance_by_cost({0, 0, 5}, 2) == std::vector<size_t>{2, 1});  // ties: the latest cut
  // The largest stage first: 6 | 6 | 1, though 4 | 2 | 7 has the smaller sum of squares.
  CHECK(balance_by_cost({4, 2, 6, 1}, 3) == std::vector<size_t>{2, 1, 1});
  CHECK(balance_by_cost({4}, 1) == std::vector<size_t>{1});
  // Small whole costs (0 to 6), where ties are common, so every rule of the order counts;
  // sums of whole numbers are exact, so the comparison is too.
  Generator gen(5);
  for (size_t n = 1; n <= 9; ++n)
    for (int stages = 1; stages <= static_cast<int>(n); ++stages)
      for (int trial = 0; trial < 6; ++trial) {
        std::vector<double> costs;
        for (int64_t c : randint(0, 7, {static_cast<int64_t>(n)}, DType::Int64, &gen).to_vector<int64_t>())
          costs.push_back(static_cast<double>(c));
        CAPTURE(n);
        CAPTURE(stages);
        CAPTURE(costs);
        CHECK(balance_by_cost(costs, stages) == best_by_brute_force(costs, stages));
      }
  // Equal costs split as the pipelines split by layer count: the first stages the longer.
  for (int stages = 1; stages <= 7; ++stages) {
    CAPTURE(stages);
    const std::vector<size_t> by_count = layer_counts(split_stages(*test::make_mlp(1), stages));
    CHECK(balance_by_cost(std::vector<double>(7, 1.0), stages) == by_count);
  }
  CHECK_THROWS_WITH(balance_by_cost({1, 2}, 3), Contains("3 stages need at least as many layers; got the costs of 2"));
  CHECK_THROWS_WITH(balance_by_cost({1, 2}, 0), Contains("at least one stage, got 0"));
  CHECK_THROWS_WITH(balance_by_cost({1, -2}, 1), Contains("layer 1's cost is -2"));
  CHECK_THROWS_WITH(balance_by_cost({std::nan(""), 2}, 1), Contains("layer 0's cost is nan"));
}

TEST_CASE("layer_times: one time per layer, measured on a copy that leaves the model, its grads and buffers") {
  auto model = small_resnet();  // BatchNorm: statistics and counts that a forward would move
  const auto before = model->state_dict();
  std::vector<Tensor> kept;
  for (const auto& [name, t] : before) kept.push_back(t.clone());
  const std::vector<double> times = layer_times(*model, test::random({4, 1, 8, 8}), kCPU, 3);
  REQUIRE(times.size() == model->size());
  for (double t : times) CHECK((std::isfinite(t) && t > 0));
  const auto after = model->state_dict();
  REQUIRE(after.size() == kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    CAPTURE(after[i].first);
    CHECK_CLOSE(after[i].second, kept[i], 0, 0);
  }
  for (const Tensor& p : model->parameters()) CHECK(!p.grad().defined());
  // Dropout draws from the device's generator or from one of its own: both as they were.
  Generator own(4);
  auto dropping = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Dropout>(0.5, &own));
  const uint64_t device_offset = default_generator(kCPU).offset(), own_offset = own.offset();
  layer_times(*dropping, test::random({4, 8}, DType::Float32), kCPU, 2);
  CHECK(default_generator(kCPU).offset() == device_offset);
  CHECK(own.offset() == own_offset);
  CHECK_THROWS_WITH(layer_times(*model, Tensor(), kCPU), Contains("no sample"));
  CHECK_THROWS_WITH(layer_times(*model, test::random({4, 1, 8, 8}), kCPU, 0), Contains("at least one round, got 0"));
  {
    NoGradGuard no_grad;
    CHECK_THROWS_WITH(layer_times(*model, test::random({4, 1, 8, 8}), kCPU), Contains("gradients are off"));
  }
}

TEST_CASE("balance_by_time: a layer sixty times dearer than the others together gets a stage of its own") {
  // Two Linear(16, 16) with ReLUs and a Linear(16, 1024), then a Linear(1024, 1024): about 60
  // times the multiply-adds of the others together (a GEMM of milliseconds against a few tens
  // of microseconds of small ops), so no noise of the machine moves the cut.
  Generator gen(3);
  const TensorOptions f32(DType::Float32);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(16, 16, true, f32, &gen));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(16, 16, true, f32, &gen));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(16, 1024, true, f32, &gen));
  model->push_back(std::make_shared<nn::Linear>(1024, 1024, true, f32, &gen));
  const Tensor sample = test::random({64, 16}, DType::Float32);
  CHECK(balance_by_time(*model, sample, 2, kCPU) == std::vector<size_t>{5, 1});
  Pipeline pipe(model, {.devices = test::cpu_devices(2), .balance_by = by_time(sample), .micro_batches = 2});
  CHECK(pipe.balance() == std::vector<size_t>{5, 1});
  CHECK_MESSAGE(pipe.extra_repr().find("balance=[5, 1]") != std::string::npos, pipe.extra_repr());
}

TEST_CASE("pipeline: balance_by is asked once, with the stages and the first device; bad answers are errors") {
  std::vector<std::tuple<size_t, int, Device>> calls;
  Balancer recording = [&](const nn::Sequential& model, int stages, Device device) {
    calls.emplace_back(model.size(), stages, device);
    return std::vector<size_t>{1, 2, 3, 1};
  };
  Pipeline pipe(test::make_mlp(1),
                {.devices = test::cpu_devices(2), .balance_by = recording, .micro_batches = 4,
                 .schedule = "interleaved", .virtual_stages = 2});
  REQUIRE(calls.size() == 1);
  CHECK(calls[0] == std::tuple<size_t, int, Device>{7, 4, Device::cpu(0)});
  CHECK(pipe.balance() == std::vector<size_t>{1, 2, 3, 1});
  CHECK_THROWS_WITH(Pipeline(test::make_mlp(1), {.devices = test::cpu_devices(2), .balance = {3, 4},
                                                 .balance_by = recording}),
                    Contains("give balance or balance_by, not both"));
  CHECK_THROWS_WITH(Pipeline(test::make_mlp(1), {.devices = test::cpu_devices(3), .balance_by = recording}),
                    Contains("balance has 4 entries for 3 stages"));
}

TEST_CASE("distributed pipeline: rank 0 measures the balance and every rank splits by it") {
  if (!parallel::gloo_available()) {
    MESSAGE("skipped: weft was built without Gloo");
    return;
  }
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "balance"}, ranks, std::chrono::seconds(60));
    test::check_all_ok(outcomes);
    for (const auto& outcome : outcomes)
      CHECK_MESSAGE(outcome.output.find("split as rank 0 measured") != std::string::npos, outcome.output);
  }
  // A measurement that fails on rank 0 fails every rank, with rank 0's error there.
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "balance-fails"}, 2, std::chrono::seconds(60));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].exit_status == 0, outcomes[r].output);
    const char* expected = r == 0 ? "no time to measure" : "balance_by failed on rank 0";
    CHECK_MESSAGE(outcomes[r].output.find(expected) != std::string::npos, outcomes[r].output);
  }
}
