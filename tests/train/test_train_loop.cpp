// TrainLoop: training reduces the loss, callbacks fire in order, evaluation counts, and
// a run resumed from a checkpoint (at an epoch's end or in the middle of one, with a
// learning-rate schedule) ends bit-identical to one that never stopped.
#include "test_util.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <unistd.h>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/models/mlp.h"
#include "nn/optim/adam.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"
#include "nn/sequential.h"
#include "train/pipeline_strategy.h"
#include "train/train_loop.h"

using namespace weft;
using doctest::Contains;

namespace {

// Four separable classes in 8 dimensions.
std::shared_ptr<data::Dataset> blobs(int64_t n, uint64_t seed) {
  Generator gen(seed), centres_gen(99);
  Tensor centres = mul(randn({4, 8}, DType::Float32, &centres_gen), 3.0);
  Tensor labels = randint(0, 4, {n}, DType::Int64, &gen);
  Tensor x = add(index_select(centres, 0, labels), randn({n, 8}, DType::Float32, &gen));
  return std::make_shared<data::TensorDataset>(x, labels);
}

// Adds noise drawn from data::batch_generator(), seeded per batch: a resumed epoch must
// number its batches as the uninterrupted one did.
class Jittered : public data::Dataset {
 public:
  explicit Jittered(std::shared_ptr<data::Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  data::Example get(int64_t index) const override { return inner_->get(index); }
  data::Batch get_batch(const std::vector<int64_t>& indices) const override {
    data::Batch b = inner_->get_batch(indices);
    b.data = add(b.data, mul(randn(b.data.shape(), DType::Float32, &data::batch_generator()), 0.3));
    return b;
  }

 private:
  std::shared_ptr<data::Dataset> inner_;
};

struct Run {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::shared_ptr<optim::LRScheduler> scheduler;
  std::unique_ptr<train::TrainLoop> loop;
};

struct RunExtras {
  int64_t checkpoint_every = 0;
  bool cosine = false;  // a CosineAnnealingLR with T_max 4, stepped per epoch
  bool warmup_cosine = false;  // a WarmupCosineLR (5 steps of warm-up, decay over 24), stepped per step
  bool jitter = false;  // the training samples get per-batch noise (Jittered)
};

// A fresh set-up; `init_seed` decides the initial weights (a resumed run must not care).
// 256 training samples in batches of 32: 8 steps an epoch.
Run make_run(uint64_t init_seed, bool adam, const std::string& checkpoint, std::ostream& log, RunExtras extras = {}) {
  Run r;
  manual_seed(init_seed);
  r.model = std::make_shared<nn::MLP>(8, std::vector<int64_t>{16}, 4, /*dropout=*/0.2);
  if (adam) r.optimizer = std::make_shared<optim::Adam>(r.model->parameters(), optim::AdamOptions{0.01});
  else r.optimizer = std::make_shared<optim::SGD>(r.model->parameters(), optim::SGDOptions{0.05, 0.9});
  if (extras.cosine) r.scheduler = std::make_shared<optim::CosineAnnealingLR>(*r.optimizer, 4);
  if (extras.warmup_cosine) r.scheduler = std::make_shared<optim::WarmupCosineLR>(*r.optimizer, 5, 24, 1e-3);
  data::DataLoaderOptions o;
  o.batch_size = 32;
  o.shuffle = true;
  o.seed = 5;
  std::shared_ptr<data::Dataset> train_set = blobs(256, 1);
  if (extras.jitter) train_set = std::make_shared<Jittered>(train_set);
  auto train = std::make_shared<data::DataLoader>(train_set, o);
  o.shuffle = false;
  auto test = std::make_shared<data::DataLoader>(blobs(128, 2), o);
  train::TrainLoopOptions options;
  options.checkpoint_path = checkpoint;
  options.checkpoint_every = extras.checkpoint_every;
  options.scheduler = r.scheduler;
  if (extras.warmup_cosine) options.scheduler_interval = train::SchedulerInterval::Step;
  options.log = &log;
  nn::CrossEntropyLoss loss;
  r.loop = std::make_unique<train::TrainLoop>(r.model, train, nullptr, test, r.optimizer,
                                              [loss](const Tensor& out, const Tensor& y) { return loss(out, y); },
                                              options);
  return r;
}

std::string scratch(const std::string& name) { return test::scratch_path("weft_test_loop_", name); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Requests a stop at the checkpoint of (epoch, epoch_samples); records every checkpoint it
// sees as "epoch/samples", read back from the file (which must be complete by then).
struct StopAt : train::Callback {
  int epoch;
  int64_t samples;
  std::vector<std::string> seen;
  StopAt(int e, int64_t s) : epoch(e), samples(s) {}
  void on_checkpoint(train::TrainLoop& loop) override {
    auto meta = load_safetensors_metadata(loop.options().checkpoint_path);
    seen.push_back(meta.at("epoch") + "/" + meta.at("epoch_samples"));
    CHECK(meta.at("epoch") == std::to_string(loop.epoch()));
    CHECK(meta.at("epoch_samples") == std::to_string(loop.epoch_samples()));
    if (loop.epoch() == epoch && loop.epoch_samples() == samples) loop.request_stop();
  }
};

struct Recorder : train::Callback {
  std::vector<std::string> events;
  void on_epoch_begin(train::TrainLoop&, int epoch) override { events.push_back("begin " + std::to_string(epoch)); }
  void on_batch_begin(train::TrainLoop&, int64_t step) override {
    if (step == 0) events.push_back("batch");
  }
  void on_after_optimizer_step(train::TrainLoop&, int64_t step) override {
    if (step == 0) events.push_back("step");
  }
  void on_batch_end(train::TrainLoop&, int64_t step, double loss) override {
    if (step == 0) events.push_back(std::isfinite(loss) ? "end" : "nan");
  }
  void on_epoch_end(train::TrainLoop&, const train::EpochResult& r) override {
    events.push_back("epoch " + std::to_string(r.epoch));
  }
};

}  // namespace

TEST_CASE("fit trains, evaluates and calls back in order") {
  std::ostringstream log;
  Run r = make_run(3, false, "", log);
  auto recorder = std::make_shared<Recorder>();
  r.loop->add_callback(recorder);
  train::Evaluation before = r.loop->evaluate(*std::make_shared<data::DataLoader>(blobs(128, 2)));
  std::vector<train::EpochResult> results = r.loop->fit(3);
  REQUIRE(results.size() == 3);
  CHECK(results[2].train_loss < results[0].train_loss);
  REQUIRE(results[2].test.has_value());
  CHECK(results[2].test->samples == 128);
  CHECK(results[2].test->accuracy > 0.9);
  CHECK(results[2].test->accuracy > before.accuracy);
  CHECK(results[0].images_per_second > 0);
  CHECK(r.loop->epoch() == 3);
  CHECK(recorder->events == std::vector<std::string>{"begin 1", "batch", "step", "end", "epoch 1", "begin 2", "batch",
                                                      "step", "end", "epoch 2", "begin 3", "batch", "step", "end",
                                                      "epoch 3"});
  CHECK(log.str().find("epoch 3/3: train loss") != std::string::npos);
  CHECK(r.loop->fit(3).empty());  // already done
}

TEST_CASE("resuming from the epoch-1 checkpoint ends with the same weights") {
  for (bool adam : {false, true}) {
    CAPTURE(adam);
    std::ostringstream log;
    std::string straight = scratch("straight.safetensors"), stopped = scratch("stopped.safetensors");
    Run a = make_run(7, adam, straight, log);
    a.loop->fit(3);

    Run b = make_run(7, adam, stopped, log);
    b.loop->fit(1);
    b = Run();
    manual_seed(12345);  // disturb the generator: resume must restore it
    Run c = make_run(8, adam, stopped, log);  // other initial weights: resume overwrites them
    c.loop->resume(stopped);
    CHECK(c.loop->epoch() == 1);
    c.loop->fit(3);

    auto pa = a.model->parameters(), pc = c.model->parameters();
    for (size_t i = 0; i < pa.size(); ++i) CHECK_CLOSE(pc[i], pa[i], 0, 0);
    auto sa = a.optimizer->state_dict(), sc = c.optimizer->state_dict();
    REQUIRE(sa.tensors.size() == sc.tensors.size());
    for (size_t i = 0; i < sa.tensors.size(); ++i) CHECK_CLOSE(sc.tensors[i].second, sa.tensors[i].second, 0, 0);
    std::filesystem::remove(straight);
    std::filesystem::remove(stopped);
  }
}

TEST_CASE("a run stopped at a mid-epoch checkpoint and resumed in a fresh loop ends as an uninterrupted one") {
  // Every 3 steps of 8: checkpoints 96 and 192 samples into each epoch. The stop comes at
  // 192 samples into epoch 2, the resumed loop trains the last 2 steps of epoch 2 and epoch
  // 3. With dropout, per-batch noise and a cosine schedule, everything must come out
  // bitwise: weights, optimizer state, the epochs' mean losses, the learning rate and the
  // final checkpoint file.
  for (bool adam : {false, true}) {
    CAPTURE(adam);
    std::ostringstream log, resumed_log;
    const RunExtras extras{.checkpoint_every = 3, .cosine = true, .jitter = true};
    const std::string straight = scratch("mid_straight.safetensors"), stopped = scratch("mid_stopped.safetensors");
    Run a = make_run(7, adam, straight, log, extras);
    const std::vector<train::EpochResult> expected = a.loop->fit(3);

    Run b = make_run(7, adam, stopped, log, extras);
    auto stop = std::make_shared<StopAt>(1, 192);
    b.loop->add_callback(stop);
    const std::vector<train::EpochResult> first = b.loop->fit(3);
    REQUIRE(first.size() == 1);  // epoch 1 completed, epoch 2 stopped part-way
    CHECK(first[0].train_loss == expected[0].train_loss);
    CHECK(stop->seen == std::vector<std::string>{"0/96", "0/192", "1/0", "1/96", "1/192"});
    CHECK(b.loop->epoch() == 1);
    CHECK(b.loop->epoch_samples() == 192);
    auto meta = load_safetensors_metadata(stopped);
    CHECK(meta.at("epoch_batches") == "6");
    CHECK(meta.at("scheduler") == "CosineAnnealingLR");
    CHECK(meta.at("scheduler.last_epoch") == "1");
    b = Run();

    manual_seed(12345);  // disturb the generator: resume must restore it
    Run c = make_run(8, adam, stopped, resumed_log, extras);  // other initial weights: resume overwrites them
    c.loop->resume(stopped);
    CHECK(c.loop->epoch() == 1);
    CHECK(c.loop->epoch_samples() == 192);
    CHECK(c.scheduler->last_epoch() == 1);
    CHECK(c.optimizer->lr() == c.scheduler->lr_at(1));
    const std::vector<train::EpochResult> rest = c.loop->fit(3);
    REQUIRE(rest.size() == 2);
    CHECK(rest[0].epoch == 2);
    // The main process's sum went on from the recorded one: the same additions, in order.
    CHECK(rest[0].train_loss == expected[1].train_loss);
    CHECK(rest[1].train_loss == expected[2].train_loss);
    CHECK(c.optimizer->lr() == a.optimizer->lr());
    CHECK(c.optimizer->lr() > 0);
    CHECK(c.scheduler->last_epoch() == 3);
    CHECK(c.loop->epoch_samples() == 0);
    // The resumed epoch's progress counts on from step 6 of 8.
    CHECK(resumed_log.str().find("epoch 2/3 step 7/8") != std::string::npos);
    CHECK(resumed_log.str().find("epoch 2/3 step 1/8") == std::string::npos);

    auto pa = a.model->parameters(), pc = c.model->parameters();
    for (size_t i = 0; i < pa.size(); ++i) CHECK_CLOSE(pc[i], pa[i], 0, 0);
    auto sa = a.optimizer->state_dict(), sc = c.optimizer->state_dict();
    REQUIRE(sa.tensors.size() == sc.tensors.size());
    for (size_t i = 0; i < sa.tensors.size(); ++i) CHECK_CLOSE(sc.tensors[i].second, sa.tensors[i].second, 0, 0);
    CHECK(file_bytes(stopped) == file_bytes(straight));
    std::filesystem::remove(straight);
    std::filesystem::remove(stopped);
  }
}

TEST_CASE("a per-step schedule stopped at a mid-epoch checkpoint and resumed goes on at the next step") {
  // 8 steps an epoch, a checkpoint every 3: the stop comes 96 samples (3 steps) into epoch 2,
  // after 11 steps of the schedule.
  std::ostringstream log, resumed_log;
  const RunExtras extras{.checkpoint_every = 3, .warmup_cosine = true};
  const std::string straight = scratch("step_straight.safetensors"), stopped = scratch("step_stopped.safetensors");
  Run a = make_run(7, true, straight, log, extras);
  a.loop->fit(3);
  CHECK(a.scheduler->last_epoch() == 24);
  CHECK(a.optimizer->lr() == 1e-3);  // the schedule's end: min_lr
  // Each epoch's line gives the rate of its last step: step 7 of the schedule (0-based) for
  // epoch 1, the cosine's last step 23 for epoch 3.
  std::ostringstream want1, want3;
  want1 << "lr " << std::setprecision(6) << a.scheduler->lr_at(7) << ",";
  want3 << "lr " << std::setprecision(6) << a.scheduler->lr_at(23) << ",";
  CHECK(log.str().find("epoch 1/3: ") != std::string::npos);
  CHECK(log.str().find(want1.str()) != std::string::npos);
  CHECK(log.str().find(want3.str()) != std::string::npos);

  Run b = make_run(7, true, stopped, log, extras);
  b.loop->add_callback(std::make_shared<StopAt>(1, 96));
  b.loop->fit(3);
  CHECK(b.scheduler->last_epoch() == 11);
  CHECK(load_safetensors_metadata(stopped).at("scheduler.last_epoch") == "11");
  b = Run();

  Run c = make_run(8, true, stopped, resumed_log, extras);
  c.loop->resume(stopped);
  CHECK(c.scheduler->last_epoch() == 11);
  CHECK(c.optimizer->lr() == c.scheduler->lr_at(11));
  c.loop->fit(3);
  CHECK(c.scheduler->last_epoch() == 24);
  auto pa = a.model->parameters(), pc = c.model->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK_CLOSE(pc[i], pa[i], 0, 0);
  CHECK(file_bytes(stopped) == file_bytes(straight));
  std::filesystem::remove(straight);
  std::filesystem::remove(stopped);
}

TEST_CASE("a mid-epoch checkpoint resumed in another sample order says so") {
  // A run in DistributedSampler's order (ddp's, here of one rank) stops 64 samples into epoch
  // 1. A loop that takes its epochs in RandomSampler's order resumes it and says that the rest
  // of the epoch is not what that run had left; a loop in the same order says nothing.
  const std::string path = scratch("order.safetensors");
  auto make = [&](bool distributed, std::ostream& log) {
    manual_seed(3);
    auto model = std::make_shared<nn::MLP>(8, std::vector<int64_t>{16}, 4);
    auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.05});
    auto loader = std::make_shared<data::DataLoader>(
        blobs(256, 1), data::DataLoaderOptions{.batch_size = 32, .shuffle = true, .seed = 5});
    if (distributed) loader = train::shard_loader(*loader, /*training=*/true, 1, 0);
    train::TrainLoopOptions options;
    options.checkpoint_path = path;
    options.checkpoint_every = 2;
    options.progress = false;
    options.log = &log;
    return std::make_unique<train::TrainLoop>(
        model, loader, nullptr, nullptr, sgd, [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); },
        options);
  };
  std::ostringstream log;
  auto first = make(true, log);
  first->add_callback(std::make_shared<StopAt>(0, 64));
  first->fit(1);
  CHECK(load_safetensors_metadata(path).at("epoch_order") == "DistributedSampler's order of 256 samples, seed 5");
  for (bool distributed : {true, false}) {
    CAPTURE(distributed);
    std::ostringstream resumed;
    make(distributed, resumed)->resume(path);
    const bool said = resumed.str().find("stopped 64 samples into epoch 1, which its run took in DistributedSampler's "
                                         "order of 256 samples, seed 5; this loop takes it in RandomSampler's "
                                         "order of 256 samples, seed 5") != std::string::npos;
    CHECK_MESSAGE(said == !distributed, resumed.str());
  }
  std::filesystem::remove(path);
}

TEST_CASE("request_stop ends fit at the next checkpoint point; fit clears it") {
  std::ostringstream log;
  const std::string path = scratch("stop.safetensors");
  Run r = make_run(3, false, path, log, {.checkpoint_every = 5});
  struct Recorder : train::Callback {
    std::vector<std::string> events;
    void on_checkpoint(train::TrainLoop& loop) override {
      events.push_back("checkpoint " + std::to_string(loop.epoch()) + "/" + std::to_string(loop.epoch_samples()));
    }
    void on_epoch_end(train::TrainLoop& loop, const train::EpochResult& result) override {
      events.push_back("end " + std::to_string(result.epoch));
      if (result.epoch == 2) loop.request_stop();  // takes effect at this epoch's end
    }
  };
  auto recorder = std::make_shared<Recorder>();
  r.loop->add_callback(recorder);
  CHECK(r.loop->fit(5).size() == 2);
  CHECK(r.loop->stop_requested());
  CHECK(recorder->events == std::vector<std::string>{"checkpoint 0/160", "checkpoint 1/0", "end 1",
                                                     "checkpoint 1/160", "checkpoint 2/0", "end 2"});
  CHECK(r.loop->epoch() == 2);
  CHECK(load_safetensors_metadata(path).at("epoch") == "2");
  CHECK(r.loop->fit(3).size() == 1);  // a new fit() starts without the old request
  CHECK(r.loop->epoch() == 3);
  std::filesystem::remove(path);

  // Without a checkpoint path there are no mid-epoch points: a stop asked for in the middle
  // of epoch 1 ends fit() at that epoch's end.
  Run quiet = make_run(3, false, "", log);
  struct StopSoon : train::Callback {
    void on_batch_end(train::TrainLoop& loop, int64_t step, double) override {
      if (step == 2) loop.request_stop();
    }
  };
  quiet.loop->add_callback(std::make_shared<StopSoon>());
  CHECK(quiet.loop->fit(3).size() == 1);
  CHECK(quiet.loop->epoch() == 1);
}

TEST_CASE("mid-epoch checkpoints and schedulers: options, old checkpoints and mismatches") {
  std::ostringstream log;
  auto build = [&](train::TrainLoopOptions options, std::shared_ptr<optim::Optimizer> optimizer = nullptr) {
    Run r = make_run(1, false, "", log);
    options.log = &log;
    return train::TrainLoop(r.model, std::make_shared<data::DataLoader>(blobs(64, 1)), nullptr, nullptr,
                            optimizer ? optimizer : r.optimizer,
                            [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); }, options);
  };
  CHECK_THROWS_WITH_AS(build({.checkpoint_every = 2}), Contains("TrainLoop: checkpoint_every = 2 needs a "
                                                                "checkpoint_path"), Error);
  CHECK_THROWS_WITH_AS(build({.checkpoint_path = "x", .checkpoint_every = -1}),
                       Contains("checkpoint_every must be non-negative"), Error);
  for (const char* key :
       {"epoch_samples", "epoch_loss_sum", "epoch_batches", "epoch_order", "scheduler", "scheduler.T_max"}) {
    CAPTURE(key);
    CHECK_THROWS_WITH_AS(build({.checkpoint_metadata = {{key, "1"}}}), Contains("is reserved for the loop's"), Error);
  }
  {
    Run other = make_run(1, false, "", log);
    auto sgd = std::make_shared<optim::SGD>(other.model->parameters(), optim::SGDOptions{0.1});
    auto foreign = std::make_shared<optim::StepLR>(*sgd, 1);
    CHECK_THROWS_WITH_AS(build({.scheduler = foreign}), Contains("the StepLR scheduler acts on another optimizer"),
                         Error);
  }

  // A checkpoint with a cosine schedule, 5 steps into epoch 2.
  const std::string path = scratch("sched.safetensors"), old = scratch("old.safetensors");
  Run r = make_run(3, false, path, log, {.checkpoint_every = 5, .cosine = true});
  r.loop->add_callback(std::make_shared<StopAt>(1, 160));
  r.loop->fit(3);
  {
    Run none = make_run(3, false, "", log);
    CHECK_THROWS_WITH_AS(none.loop->resume(path), Contains("holds the state of a CosineAnnealingLR learning-rate "
                                                           "scheduler, but this loop has none"), Error);
    CHECK(none.loop->epoch() == 0);  // nothing changed
    Run step = make_run(3, false, "", log);
    auto step_lr = std::make_shared<optim::StepLR>(*step.optimizer, 1);
    train::TrainLoop with_step(step.model, std::make_shared<data::DataLoader>(blobs(64, 1)), nullptr, nullptr,
                               step.optimizer, [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); },
                               {.scheduler = step_lr, .log = &log});
    CHECK_THROWS_WITH_AS(with_step.resume(path), Contains("was written with a CosineAnnealingLR scheduler, but this "
                                                          "loop has a StepLR"), Error);
  }
  // Written before mid-epoch checkpoints and schedulers existed: no such keys, an epoch's end.
  SafetensorsFile file = load_safetensors(path);
  for (const char* key : {"epoch_samples", "epoch_loss_sum", "epoch_batches", "scheduler", "scheduler.T_max",
                          "scheduler.eta_min", "scheduler.base_lr", "scheduler.last_epoch"})
    file.metadata.erase(key);
  save_safetensors(old, file.tensors, file.metadata);
  Run plain = make_run(3, false, "", log);
  plain.loop->resume(old);
  CHECK(plain.loop->epoch() == 1);
  CHECK(plain.loop->epoch_samples() == 0);
  Run cosine = make_run(3, false, "", log, {.cosine = true});
  CHECK_THROWS_WITH_AS(cosine.loop->resume(old), Contains("was written without a learning-rate scheduler, but this "
                                                          "loop has a CosineAnnealingLR"), Error);
  std::filesystem::remove(path);
  std::filesystem::remove(old);
}

TEST_CASE("the pipeline mode trains like one device: same weights, same batches") {
  // Two epochs of a 4-layer Sequential, once on cpu:0 and once split over cpu:0 / cpu:1 with
  // 4 micro-batches under 1F1B (float32: micro-batches sum in another order, hence 1e-5).
  std::vector<std::vector<Tensor>> trained;
  for (bool pipeline : {false, true}) {
    std::ostringstream log;
    Generator gen(21);
    auto model = std::make_shared<nn::Sequential>(
        std::make_shared<nn::Linear>(8, 16, true, TensorOptions(), &gen), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 16, true, TensorOptions(), &gen),
        std::make_shared<nn::Linear>(16, 4, true, TensorOptions(), &gen));
    auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.05, 0.9});
    data::DataLoaderOptions o;
    o.batch_size = 30;  // 256 samples: a short last batch of 16
    o.shuffle = true;
    o.seed = 5;
    train::TrainLoopOptions options;
    options.log = &log;
    if (pipeline)
      options.strategy = std::make_shared<train::PipelineStrategy>(train::PipelineStrategyOptions{
          .devices = test::cpu_devices(2), .micro_batches = 4, .schedule = "1f1b"});
    nn::CrossEntropyLoss loss;
    train::TrainLoop loop(model, std::make_shared<data::DataLoader>(blobs(256, 1), o), nullptr, nullptr, sgd,
                          [loss](const Tensor& out, const Tensor& y) { return loss(out, y); }, options);
    loop.fit(2);
    std::vector<Tensor> params;
    for (const Tensor& p : model->parameters()) params.push_back(p.detach().to(kCPU));
    trained.push_back(params);
  }
  REQUIRE(trained[0].size() == trained[1].size());
  for (size_t i = 0; i < trained[0].size(); ++i) CHECK_CLOSE(trained[1][i], trained[0][i], 1e-5, 1e-5);
}

TEST_CASE("a diverged run stops with a message and keeps the last good checkpoint") {
  // Issue 11, item 2: NaN losses trained on, exited 0 and overwrote every checkpoint.
  std::ostringstream log;
  const std::string path = scratch("diverged.safetensors");
  Run r = make_run(7, false, path, log);
  r.loop->fit(1);
  auto read = [&] { return file_bytes(path); };
  const std::string good = read();
  REQUIRE(!good.empty());
  {
    NoGradGuard no_grad;
    const Tensor w = r.model->parameters()[0];
    w.copy_(full(w.shape(), std::nan(""), TensorOptions(w.dtype())));
  }
  const std::string expected = "training diverged: the loss is nan in epoch 2 (step 1 of 8), so the weights are "
                               "no longer usable; the checkpoint of epoch 1 ('" + path + "') is kept";
  CHECK_THROWS_WITH_AS(r.loop->fit(2), Contains(expected.c_str()), Error);
  CHECK(read() == good);
  CHECK_THROWS_WITH_AS(r.loop->save_checkpoint(path), Contains("holds NaN or infinite values"), Error);
  CHECK(read() == good);
  std::filesystem::remove(path);
}

TEST_CASE("TrainLoop errors") {
  std::ostringstream log;
  CHECK(train::parse_parallel_mode("single") == train::ParallelMode::Single);
  CHECK(train::parse_parallel_mode("ddp") == train::ParallelMode::DistributedDataParallel);
  CHECK(train::parse_parallel_mode("pipeline") == train::ParallelMode::Pipeline);
  CHECK_THROWS_WITH_AS(train::parse_parallel_mode("tpu"), Contains("unknown parallel mode 'tpu'"), Error);
  Run r = make_run(1, false, "", log);
  std::string bogus = scratch("bogus.safetensors");
  save_safetensors(bogus, {{"w", zeros({2})}});
  CHECK_THROWS_WITH_AS(r.loop->resume(bogus), Contains("is not a weft checkpoint"), Error);
  std::filesystem::remove(bogus);
}

TEST_CASE("the loop trains where the model is, or where SingleDevice moves it") {
  std::ostringstream log;
  {
    Run r = make_run(1, false, "", log);
    r.model->to(Device("cpu:1"));
    reset_peak_memory_stats(Device("cpu:1"));
    train::TrainLoop loop(r.model, std::make_shared<data::DataLoader>(blobs(64, 1), data::DataLoaderOptions{.batch_size = 16}),
                          nullptr, nullptr, r.optimizer, [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); },
                          {.log = &log});
    CHECK(loop.strategy().input_device() == Device("cpu:1"));
    loop.fit(1);
    CHECK(r.model->device() == Device("cpu:1"));
    CHECK(memory_stats(Device("cpu:1")).peak_bytes_in_use > 0);
  }
  {
    Run r = make_run(1, false, "", log);
    train::TrainLoopOptions options;
    options.strategy = std::make_shared<train::SingleDevice>(Device("cpu:2"));
    options.log = &log;
    train::TrainLoop loop(r.model, std::make_shared<data::DataLoader>(blobs(64, 1), data::DataLoaderOptions{.batch_size = 16}),
                          nullptr, nullptr, r.optimizer, [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); },
                          options);
    for (const Tensor& p : r.optimizer->params()) CHECK(p.device() == Device("cpu:2"));  // moved in place
    CHECK(loop.fit(1).front().train_loss > 0);
  }
}

// A strategy that counts the loop's calls and says this process is not the main one.
struct CountingStrategy : train::Strategy {
  train::SingleDevice single;
  int prepared = 0, steps = 0, reductions = 0, sharded = 0;
  train::ParallelMode mode() const override { return train::ParallelMode::Single; }
  int rank() const override { return 1; }
  std::shared_ptr<nn::Module> prepare_model(std::shared_ptr<nn::Module> model) override {
    ++prepared;
    return single.prepare(model);
  }
  Device input_device() const override { return single.input_device(); }
  std::shared_ptr<data::DataLoader> shard(std::shared_ptr<data::DataLoader> loader, bool training) override {
    sharded += training ? 10 : 1;
    return loader;
  }
  Tensor train_step(const data::Batch& batch, const train::Criterion& criterion,
                    optim::Optimizer& optimizer) override {
    ++steps;
    return Strategy::train_step(batch, criterion, optimizer);
  }
  train::Totals reduce(const train::Totals& local) override {
    ++reductions;
    train::Totals doubled = local;  // as if a second process had seen the same
    doubled.loss *= 2, doubled.correct *= 2, doubled.samples *= 2, doubled.batches *= 2;
    return doubled;
  }
};

TEST_CASE("the loop asks its strategy: prepare, shard, step, reduce; only the main process logs and saves") {
  std::ostringstream log;
  std::string checkpoint = scratch("not_main.safetensors");
  Run r = make_run(1, false, "", log);
  auto strategy = std::make_shared<CountingStrategy>();
  train::TrainLoopOptions options;
  options.strategy = strategy;
  options.log = &log;
  options.checkpoint_path = checkpoint;
  auto train_loader = std::make_shared<data::DataLoader>(blobs(64, 1), data::DataLoaderOptions{.batch_size = 16});
  auto test_loader = std::make_shared<data::DataLoader>(blobs(32, 2), data::DataLoaderOptions{.batch_size = 16});
  train::TrainLoop loop(r.model, train_loader, nullptr, test_loader, r.optimizer,
                        [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); }, options);
  CHECK(strategy->prepared == 1);
  CHECK(strategy->sharded == 11);  // the train loader and the test loader
  log.str("");
  auto results = loop.fit(1);
  CHECK(strategy->steps == 4);
  CHECK(strategy->reductions == 3);  // the ranks' starting point, the epoch's totals and the test evaluation's
  CHECK(results.front().test->samples == 64);
  CHECK(log.str().empty());
  CHECK_FALSE(std::filesystem::exists(checkpoint));
}

// A second "rank" that resumed from another checkpoint: one epoch further (the starting
// epoch travels in `correct`).
struct AheadStrategy : CountingStrategy {
  train::Totals reduce(const train::Totals& local) override {
    train::Totals both = local;
    both.loss *= 2, both.correct = 2 * local.correct + 1, both.samples *= 2, both.batches *= 2;
    return both;
  }
};

TEST_CASE("ranks that would start fit() at different points are stopped before the first step") {
  std::ostringstream log;
  Run r = make_run(1, false, "", log);
  train::TrainLoopOptions options;
  auto strategy = std::make_shared<AheadStrategy>();
  options.strategy = strategy;
  options.log = &log;
  auto loader = std::make_shared<data::DataLoader>(blobs(64, 1), data::DataLoaderOptions{.batch_size = 16});
  train::TrainLoop loop(r.model, loader, nullptr, nullptr, r.optimizer,
                        [](const Tensor& o, const Tensor& y) { return cross_entropy(o, y); }, options);
  CHECK_THROWS_WITH(loop.fit(1), doctest::Contains("rank 1 starts after epoch 0 + 0 samples, but the job's ranks start "
                                                   "on average after epoch 0.5 + 0 samples: every rank must resume from "
                                                   "the same checkpoint"));
  CHECK(strategy->steps == 0);
}
