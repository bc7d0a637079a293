// train/checkpoint.h on its own: a checkpoint written and read back holds what was written,
// under the keys of the format, every entry the loop writes is reserved, the older format is
// still read, and a bad file is named with the entry at fault. (Resuming a TrainLoop from its
// checkpoints, and what the resumed run computes, is test_train_loop's.)
#include "test_util.h"


#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "core/generator.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/models/convnet.h"
#include "nn/models/mlp.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"
#include "nn/sequential.h"
#include "train/checkpoint.h"
#include "train/pipeline_strategy.h"

using namespace weft;
using doctest::Contains;

namespace {

std::string scratch(const std::string& name) { return test::scratch_path("weft_test_checkpoint_", name); }

}  // namespace

TEST_CASE("write_checkpoint then read_checkpoint: every field comes back, doubles to the last bit") {
  Generator gen(3);
  train::Checkpoint c;
  c.epoch = 2;
  c.epoch_samples = 300, c.epoch_batches = 3;
  c.epoch_loss_sum = 0.1 + 0.2;  // not a short decimal
  c.epoch_order = "DistributedSampler(seed=0)";
  c.model = {{"fc.weight", randn({3, 4}, DType::Float32, &gen)}, {"fc.bias", randn({3}, DType::Float64, &gen)}};
  c.optimizer.tensors = {{"0.momentum_buffer", randn({3, 4}, DType::Float32, &gen)}};
  c.optimizer.scalars = {{"lr", 1.0 / 3.0}};
  c.scheduler = "StepLR";
  c.scheduler_state = {{"last_epoch", 2}};
  c.strategy_state = {{"local_sgd_step", 7}};
  c.generators = {{Device("cpu:0"), 11, 1234}, {Device("cpu:1"), 99, 8}};
  c.metadata = {{"run.model", "convnet"}};
  const std::string path = scratch("roundtrip.safetensors");
  train::write_checkpoint(path, c);
  const train::Checkpoint back = train::read_checkpoint(path);
  CHECK(back.epoch == 2);
  CHECK(back.epoch_samples == 300);
  CHECK(back.epoch_batches == 3);
  CHECK(back.epoch_loss_sum == c.epoch_loss_sum);
  CHECK(back.epoch_order == c.epoch_order);
  // The file keeps tensors by name, not in the order given.
  std::map<std::string, Tensor> model(back.model.begin(), back.model.end());
  REQUIRE(model.size() == 2);
  for (const auto& [name, t] : c.model) {
    REQUIRE(model.count(name) == 1);
    CHECK(model.at(name).dtype() == t.dtype());
    CHECK_CLOSE(model.at(name), t, 0, 0);
  }
  REQUIRE(back.optimizer.tensors.size() == 1);
  CHECK_CLOSE(back.optimizer.tensors[0].second, c.optimizer.tensors[0].second, 0, 0);
  CHECK(back.optimizer.scalars == c.optimizer.scalars);
  CHECK(back.scheduler == "StepLR");
  CHECK(back.scheduler_state == c.scheduler_state);
  CHECK(back.strategy_state == c.strategy_state);
  REQUIRE(back.generators.size() == 2);
  CHECK(back.generators[1].device == Device("cpu:1"));
  CHECK(back.generators[1].seed == 99);
  CHECK(back.generators[1].offset == 8);
  CHECK(back.metadata == c.metadata);  // the program's own entries, and only those
  // The file itself, as other programs read it: the format's keys, doubles to 17 digits.
  const SafetensorsFile file = load_safetensors(path);
  const std::map<std::string, std::string> expected{{"format", "weft-checkpoint-2"},
                                                    {"epoch", "2"},
                                                    {"epoch_samples", "300"},
                                                    {"epoch_batches", "3"},
                                                    {"epoch_loss_sum", "0.30000000000000004"},
                                                    {"epoch_order", "DistributedSampler(seed=0)"},
                                                    {"rng.cpu:0.seed", "11"},
                                                    {"rng.cpu:0.offset", "1234"},
                                                    {"rng.cpu:1.seed", "99"},
                                                    {"rng.cpu:1.offset", "8"},
                                                    {"optimizer.lr", "0.33333333333333331"},
                                                    {"scheduler", "StepLR"},
                                                    {"scheduler.last_epoch", "2"},
                                                    {"strategy.local_sgd_step", "7"},
                                                    {"run.model", "convnet"}};
  CHECK(file.metadata == expected);
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors) names.push_back(name);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"model.fc.bias", "model.fc.weight", "optimizer.0.momentum_buffer"});
  std::filesystem::remove(path);
}

TEST_CASE("format 1 (one generator, rng.seed and rng.offset, for cpu:0) is still read; without a scheduler") {
  const std::string path = scratch("format1.safetensors");
  save_safetensors(path, {{"model.w", ones({2})}},
                   {{"format", "weft-checkpoint-1"}, {"epoch", "4"}, {"rng.seed", "5"}, {"rng.offset", "64"}});
  const train::Checkpoint c = train::read_checkpoint(path);
  CHECK(c.epoch == 4);
  CHECK(c.epoch_samples == 0);  // written before mid-epoch checkpoints: an epoch's end
  CHECK(!c.scheduler.has_value());
  REQUIRE(c.generators.size() == 1);
  CHECK(c.generators[0].device == Device("cpu:0"));
  CHECK(c.generators[0].seed == 5);
  CHECK(c.generators[0].offset == 64);
  std::filesystem::remove(path);
}

TEST_CASE("the loop's own metadata keys are reserved; a file that is not a checkpoint is named") {
  for (const char* key : {"format", "epoch", "epoch_samples", "epoch_order", "scheduler", "rng.cpu:0.seed",
                          "optimizer.lr", "scheduler.last_epoch", "strategy.local_sgd_step"})
    CHECK(train::is_checkpoint_metadata(key));
  CHECK(!train::is_checkpoint_metadata("run.model"));
  CHECK(!train::is_checkpoint_metadata("epochs"));

  const std::string path = scratch("not_a_checkpoint.safetensors");
  save_safetensors(path, {{"w", ones({2})}}, {{"format", "pt"}});
  CHECK_THROWS_WITH_AS(train::read_checkpoint(path), Contains("is not a weft checkpoint"), Error);
  save_safetensors(path, {{"model.w", ones({2})}}, {{"format", "weft-checkpoint-2"}, {"epoch", "x"}});
  CHECK_THROWS_WITH_AS(train::read_checkpoint(path), Contains("metadata 'epoch' is not a non-negative integer: 'x'"),
                       Error);
  save_safetensors(path, {{"weights", ones({2})}}, {{"format", "weft-checkpoint-2"}, {"epoch", "1"}});
  CHECK_THROWS_WITH_AS(train::read_checkpoint(path), Contains("holds an unexpected tensor 'weights'"), Error);
  save_safetensors(path, {}, {{"format", "weft-checkpoint-2"}, {"epoch", "1"}, {"rng.gpu7.seed", "1"}});
  CHECK_THROWS_WITH_AS(train::read_checkpoint(path), Contains("metadata 'rng.gpu7.seed' names no device"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("check_resumable: a scheduler saved or missing, of another kind, is named before anything changes") {
  Generator gen(1);
  auto model = std::make_shared<nn::Linear>(2, 2, true, TensorOptions(), &gen);
  optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1});
  optim::StepLR step(sgd, 2, 0.5);
  train::SingleDevice strategy;
  train::Checkpoint plain;
  CHECK_NOTHROW(train::check_resumable(plain, "a.safetensors", nullptr, strategy));
  CHECK_THROWS_WITH_AS(train::check_resumable(plain, "a.safetensors", &step, strategy),
                       Contains("'a.safetensors' was written without a learning-rate scheduler"), Error);
  train::Checkpoint scheduled;
  scheduled.scheduler = "CosineAnnealingLR";
  CHECK_THROWS_WITH_AS(train::check_resumable(scheduled, "b.safetensors", &step, strategy),
                       Contains("written with a CosineAnnealingLR scheduler, but this loop has a StepLR"), Error);
  CHECK_THROWS_WITH_AS(train::check_resumable(scheduled, "b.safetensors", nullptr, strategy),
                       Contains("holds the state of a CosineAnnealingLR learning-rate scheduler, but this loop "
                                "has none"),
                       Error);
}
