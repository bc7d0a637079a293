// DataParallel on logical CPU devices: equivalence with one device (ConvNet, MLP, ResNet and
// a GPT trained 20 steps over 2, 3 and 4 devices, batch 5 over 4 included), replicate's
// gradients and buffers, bit-identical repeat runs with dropout, errors named by replica
// and device, the module / state_dict interface, and the TrainLoop's 'dp' strategy with
// checkpoints that move between dp and single-device runs.
#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>
#include <unistd.h>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "nn/models/gpt.h"
#include "nn/safetensors.h"
#include "parallel/local/data_parallel.h"
#include "parallel/local/parallel_apply.h"
#include "parallel/local/replicate.h"
#include "train/data_parallel_strategy.h"
#include "train/train_loop.h"

using namespace weft;
using doctest::Contains;

namespace {

// Step s's batch (input, target).
using BatchOf = std::function<std::pair<Tensor, Tensor>(int step)>;

// Trains `reference` on one device and a copy of it under DataParallel over `devices`,
// from the same weights on the same batches, and compares the parameters at the end.
void check_equivalent(const std::shared_ptr<nn::Module>& reference, const std::vector<Device>& devices,
                      const BatchOf& batch_of, const nn::Criterion& criterion, int steps, double rtol) {
  CAPTURE(reference->type_name());
  CAPTURE(devices.size());
  std::shared_ptr<nn::Module> copy = reference->clone();
  auto dp = std::make_shared<parallel::DataParallel>(copy, devices);
  optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD sgd_dp(copy->parameters(), optim::SGDOptions{0.05, 0.9});
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = batch_of(s);
    for (auto [model, sgd] : {std::pair<nn::Module*, optim::SGD*>{reference.get(), &sgd_ref}, {dp.get(), &sgd_dp}}) {
      sgd->zero_grad();
      criterion(model->forward(x), y).backward();
      sgd->step();
    }
  }
  auto expected = reference->named_parameters(), actual = copy->named_parameters();
  REQUIRE(expected.size() == actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(actual[i].second.device() == devices[0]);
    CHECK_CLOSE(actual[i].second, expected[i].second, 1e-12, rtol);
  }
}

// Batches of `batch` normal samples shaped `sample` (float64) with class targets.
void check_equivalent(const std::shared_ptr<nn::Module>& reference, const std::vector<Device>& devices,
                      const Shape& sample, int64_t batch, int steps, double rtol) {
  CAPTURE(batch);
  Shape shape = sample;
  shape.insert(0, batch);
  auto batch_of = [&](int s) {
    Generator gen(1000 + s);
    Tensor x = randn(shape, TensorOptions(DType::Float64), &gen);
    return std::pair(x, randint(0, 10, {batch}, DType::Int64, &gen));
  };
  auto criterion = [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); };
  check_equivalent(reference, devices, batch_of, criterion, steps, rtol);
}

// Throws when its input is on `bad`.
struct FailsOn : nn::Cloneable<FailsOn> {
  Device bad;
  explicit FailsOn(Device d) : Cloneable("FailsOn"), bad(d) { register_parameter("w", ones({3})); }
  Tensor forward(const Tensor& x) override {
    WEFT_CHECK(x.device() != bad, "FailsOn: refused an input on ", bad);
    return mul(x, param("w").to(x.device()));
  }
};

std::string scratch(const std::string& name) { return test::scratch_path("weft_test_dp_", name); }

}  // namespace

TEST_CASE("DataParallel trains like one device: ConvNet, MLP and ResNet over 2, 3 and 4 devices") {
  // float64, so that the only difference is the order of a few sums (tolerance 1e-9).
  Generator gen(3);
  auto mlp = std::make_shared<nn::MLP>(20, std::vector<int64_t>{16}, 10, 0.0, &gen);
  mlp->to(DType::Float64);
  for (int n : {2, 3, 4})
    check_equivalent(std::static_pointer_cast<nn::Module>(mlp->clone()), test::cpu_devices(n), {20}, 12, 20, 1e-9);
  check_equivalent(mlp, test::cpu_devices(4), {20}, 5, 20, 1e-9);  // 5 samples over 4 devices: 2, 2, 1 on three

  auto convnet = std::make_shared<nn::ConvNet>(10, &gen);
  convnet->to(DType::Float64);
  for (int n : {2, 3})
    check_equivalent(std::static_pointer_cast<nn::Module>(convnet->clone()), test::cpu_devices(n), {1, 28, 28}, 6,
                     20, 1e-9);

  // BatchNorm in evaluation mode: the running statistics normalise every chunk alike.
  auto resnet = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
  resnet->to(DType::Float64);
  resnet->eval();
  check_equivalent(resnet, test::cpu_devices(4), {1, 12, 12}, 8, 20, 1e-9);
}

TEST_CASE("DataParallel trains a GPT like one device, its tied embedding included, over 2 and 3 devices") {
  Generator gen(4);
  auto gpt = std::make_shared<nn::GPT>(
      nn::GPTConfig{.vocab_size = 13, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 8}, DType::Float64,
      &gen);
  auto batch_of = [](int s) {
    Generator g(3000 + s);
    return std::pair(randint(0, 13, {7, 6}, DType::Int64, &g), randint(0, 13, {7, 6}, DType::Int64, &g));
  };
  for (int n : {2, 3})
    check_equivalent(std::static_pointer_cast<nn::Module>(gpt->clone()), test::cpu_devices(n), batch_of,
                     nn::next_token_loss, 20, 1e-9);
}

TEST_CASE("replicate: replicas on each device, gradients summed into the module, replica 0 shares the buffers") {
  Generator gen(4);
  auto model = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1, 1, 1, true, TensorOptions(), &gen), std::make_shared<nn::BatchNorm2d>(3));
  const auto devices = test::cpu_devices(3);
  auto replicas = parallel::replicate(*model, devices);
  REQUIRE(replicas.size() == 3);
  for (size_t d = 0; d < 3; ++d) {
    for (const Tensor& p : replicas[d]->parameters()) {
      CHECK(p.device() == devices[d]);
      CHECK_FALSE(p.is_leaf());  // outputs of the broadcast
    }
    for (const Tensor& b : replicas[d]->buffers()) CHECK(b.device() == devices[d]);
  }
  auto own = model->buffers(), first = replicas[0]->buffers(), second = replicas[1]->buffers();
  for (size_t i = 0; i < own.size(); ++i) {
    CHECK(first[i].storage() == own[i].storage());   // replica 0: the module's own buffers
    CHECK(second[i].storage() != own[i].storage());  // the others: copies
  }
  // Training-mode forward: replica 0's running-statistics update lands in the module.
  Tensor before = model->buffers()[0].clone();
  Tensor x = test::random({4, 2, 5, 5}, DType::Float32, 5);
  Tensor total;
  for (size_t d = 0; d < 3; ++d) {
    Tensor part = mul(sum(replicas[d]->forward(x.to(devices[d]))), static_cast<double>(d + 1)).to(devices[0]);
    total = total.defined() ? add(total, part) : part;
  }
  CHECK(test::mismatch(model->buffers()[0], before, 0, 0) != "");
  CHECK(model->named_buffers()[2].second.item() == 1.0);  // num_batches_tracked, from replica 0 only
  total.backward();
  // The same three terms on the module itself: 1 + 2 + 3 times one forward's gradient.
  std::vector<Tensor> got;
  for (const Tensor& p : model->parameters()) got.push_back(p.grad().clone());
  model->zero_grad();
  auto fresh = std::static_pointer_cast<nn::Module>(model->clone());
  mul(sum(fresh->forward(x)), 6.0).backward();
  auto want = fresh->parameters();
  for (size_t i = 0; i < got.size(); ++i) CHECK_CLOSE(got[i], want[i].grad(), 1e-5, 1e-5);

  auto detached = parallel::replicate(*model, devices, /*detach=*/true);
  for (const Tensor& p : detached[1]->parameters()) CHECK_FALSE(p.requires_grad());
  model->to(Device("cpu:1"));
  CHECK_THROWS_WITH_AS(parallel::replicate(*model, devices),
                       Contains("Sequential's parameter '0.weight' is on cpu:1 but the module must be on devices[0], cpu:0"),
                       Error);
}

TEST_CASE("DataParallel with dropout: two runs with the same seed are bit-identical") {
  Generator gen(6);
  nn::MLP base(12, {32, 16}, 10, /*dropout=*/0.3, &gen);
  auto run = [&] {
    manual_seed(99);
    auto model = std::static_pointer_cast<nn::Module>(base.clone());
    parallel::DataParallel dp(model, test::cpu_devices(3));
    optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1, 0.9});
    for (int s = 0; s < 5; ++s) {
      Generator data(50 + s);
      sgd.zero_grad();
      cross_entropy(dp(randn({10, 12}, DType::Float32, &data)), randint(0, 10, {10}, DType::Int64, &data)).backward();
      sgd.step();
    }
    return model->parameters();
  };
  auto a = run(), b = run();
  for (size_t i = 0; i < a.size(); ++i) CHECK_CLOSE(a[i], b[i], 0, 0);
}

TEST_CASE("DataParallel: an exception in one replica names the replica and its device") {
  auto model = std::make_shared<FailsOn>(Device("cpu:2"));
  parallel::DataParallel dp(model, test::cpu_devices(4));
  CHECK_THROWS_WITH_AS(dp(ones({8, 3})), Contains("in replica 2 on device cpu:2: FailsOn: refused an input on cpu:2"),
                       Error);
  CHECK(dp(ones({2, 3})).shape() == Shape{2, 3});  // two chunks, on cpu:0 and cpu:1: it goes on working
  CHECK_THROWS_WITH_AS(dp(ones({2, 3}, TensorOptions(DType::Float64))), Contains("in replica 0 on device cpu:0: "), Error);
}

TEST_CASE("DataParallel: module(), state_dict keys, one device, output_device, dim, errors") {
  Generator gen(7);
  auto mlp = std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 3, 0.0, &gen);
  auto dp = std::make_shared<parallel::DataParallel>(mlp, test::cpu_devices(2), Device("cpu:1"));
  CHECK(&dp->module() == mlp.get());
  auto keys = dp->state_dict();
  REQUIRE(keys.size() == mlp->state_dict().size());
  CHECK(keys[0].first == "module." + mlp->state_dict()[0].first);
  CHECK(dp->repr().rfind("DataParallel(device_ids=[cpu:0, cpu:1], output_device=cpu:1, dim=0\n  (module): MLP(", 0) == 0);
  Tensor x = test::random({7, 6}, DType::Float32, 8);
  Tensor out = (*dp)(x);
  CHECK(out.device() == Device("cpu:1"));
  CHECK_CLOSE(out.to(kCPU), (*mlp)(x), 1e-6, 1e-5);

  parallel::DataParallel one(mlp, {Device("cpu:0")});  // one device: the module itself
  CHECK_CLOSE(one(x), (*mlp)(x), 0, 0);

  // dim 1: the batch is the second dimension.
  struct Transposed : nn::Cloneable<Transposed> {
    Transposed() : Cloneable("Transposed") {}
    Tensor forward(const Tensor& x) override { return mul(x, 2.0); }
  };
  parallel::DataParallel by_columns(std::make_shared<Transposed>(), test::cpu_devices(3), std::nullopt, 1);
  Tensor wide = test::random({2, 7}, DType::Float32, 9);
  CHECK_CLOSE(by_columns(wide), mul(wide, 2.0), 0, 0);

  CHECK_THROWS_WITH_AS(parallel::DataParallel(mlp, {Device("cpu:0"), Device::cuda(0)}),
                       Contains("devices must all be CPU devices or all CUDA devices, got cpu:0 and cuda:0"), Error);
  CHECK_THROWS_WITH_AS(parallel::DataParallel(mlp, {Device("cpu:1"), Device("cpu:1")}),
                       Contains("device cpu:1 is given twice"), Error);
  parallel::DataParallel misplaced(mlp, {Device("cpu:2"), Device("cpu:3")});
  CHECK_THROWS_WITH_AS(misplaced(x), Contains("is on cpu:0 but the module must be on devices[0], cpu:2"), Error);
  CHECK_THROWS_WITH_AS(parallel::parse_device_list("cpu:0,gpu:1"), Contains("entry 1: invalid device 'gpu:1'"), Error);
  CHECK_THROWS_WITH_AS(parallel::parse_device_list("cpu:0,,cpu:1"), Contains("entry 1 is empty"), Error);
  CHECK(parallel::parse_device_list(" cpu:0, cpu:3") == std::vector<Device>{Device("cpu:0"), Device("cpu:3")});
}

TEST_CASE("TrainLoop 'dp': trains like one device, and checkpoints move between dp and single runs") {
  auto blobs = [](int64_t n, uint64_t seed) {
    Generator g(seed), centres_gen(99);
    Tensor centres = mul(randn({4, 8}, DType::Float32, &centres_gen), 3.0);
    Tensor labels = randint(0, 4, {n}, DType::Int64, &g);
    return std::make_shared<data::TensorDataset>(add(index_select(centres, 0, labels), randn({n, 8}, DType::Float32, &g)),
                                                 labels);
  };
  auto make = [&](std::shared_ptr<train::Strategy> strategy, const std::string& checkpoint, std::ostream& log) {
    Generator gen(12);
    auto model = std::make_shared<nn::MLP>(8, std::vector<int64_t>{16}, 4, 0.0, &gen);
    auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.05, 0.9});
    auto train = std::make_shared<data::DataLoader>(blobs(96, 1), data::DataLoaderOptions{.batch_size = 32, .shuffle = true, .seed = 5});
    auto test = std::make_shared<data::DataLoader>(blobs(64, 2), data::DataLoaderOptions{.batch_size = 32});
    train::TrainLoopOptions options;
    options.strategy = std::move(strategy);
    options.checkpoint_path = checkpoint;
    options.log = &log;
    return std::make_pair(model, std::make_unique<train::TrainLoop>(
                                     model, train, nullptr, test, sgd,
                                     [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); }, options));
  };
  std::ostringstream log;
  const std::string dp_ckpt = scratch("dp.st"), single_ckpt = scratch("single.st");
  auto [single_model, single] = make(nullptr, single_ckpt, log);
  auto strategy = std::make_shared<train::DataParallelStrategy>(test::cpu_devices(3));
  auto [dp_model, dp] = make(strategy, dp_ckpt, log);
  CHECK(strategy->world_size() == 3);
  CHECK(dp->strategy().mode() == train::ParallelMode::DataParallel);
  auto single_results = single->fit(2), dp_results = dp->fit(2);
  CHECK(dp_results.back().train_loss == doctest::Approx(single_results.back().train_loss).epsilon(1e-5));
  CHECK(dp_results.back().test->accuracy == single_results.back().test->accuracy);
  CHECK(dp_results.back().test->samples == 64);
  auto a = single_model->parameters(), b = dp_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK_CLOSE(b[i], a[i], 1e-6, 1e-4);

  // A dp checkpoint resumes a single-device run, and the other way round.
  auto [m1, resumed_single] = make(nullptr, "", log);
  resumed_single->resume(dp_ckpt);
  CHECK(resumed_single->epoch() == 2);
  for (size_t i = 0; i < a.size(); ++i) CHECK_CLOSE(m1->parameters()[i], b[i], 0, 0);
  auto [m2, resumed_dp] = make(std::make_shared<train::DataParallelStrategy>(test::cpu_devices(2)), "", log);
  resumed_dp->resume(single_ckpt);
  for (size_t i = 0; i < a.size(); ++i) CHECK_CLOSE(m2->parameters()[i], a[i], 0, 0);
  CHECK(resumed_dp->fit(3).back().train_loss > 0);
  std::filesystem::remove(dp_ckpt);
  std::filesystem::remove(single_ckpt);
}

TEST_CASE("TrainLoop trace_path: a Chrome trace with a row per device and DataParallel's phases") {
  Generator gen(13);
  auto model = std::make_shared<nn::MLP>(8, std::vector<int64_t>{8}, 4, 0.0, &gen);
  auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.05});
  Generator data(14);
  auto set = std::make_shared<data::TensorDataset>(randn({40, 8}, DType::Float32, &data), randint(0, 4, {40}, DType::Int64, &data));
  auto loader = std::make_shared<data::DataLoader>(set, data::DataLoaderOptions{.batch_size = 20});
  std::ostringstream log;
  train::TrainLoopOptions options;
  options.strategy = std::make_shared<train::DataParallelStrategy>(test::cpu_devices(2));
  options.log = &log;
  options.trace_path = scratch("run.trace.json");
  train::TrainLoop loop(model, loader, nullptr, loader, sgd, [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); },
                        options);
  loop.fit(1);
  std::ifstream in(options.trace_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* expected : {R"("args":{"name":"cpu:0"})", R"("args":{"name":"cpu:1"})", R"("name":"scatter")",
                               R"("name":"replicate")", R"("name":"gather")", R"("name":"backward")",
                               R"("name":"optimizer step")", R"("name":"evaluate")", R"("replica":1)"})
    CHECK_MESSAGE(text.find(expected) != std::string::npos, "the trace lacks ", expected);
  std::filesystem::remove(options.trace_path);
  options.trace_path = "/nonexistent-dir/x.json";
  options.strategy = std::make_shared<train::DataParallelStrategy>(test::cpu_devices(2));  // one per loop
  train::TrainLoop unwritable(model, loader, nullptr, nullptr, sgd,
                              [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); }, options);
  CHECK_THROWS_WITH_AS(unwritable.fit(1), Contains("/nonexistent-dir/x.json"), Error);
  CHECK(unwritable.epoch() == 0);  // refused before any work
}
