// Activation checkpointing in pipelines (parallel/pipeline/stage_runner.h): recomputed
// micro-batches give the plain pipeline's losses and weights (with dropout, whose second
// forward must draw what the first drew, and with BatchNorm, whose statistics must count each
// micro-batch once), a stage holds one micro-batch's activations instead of one per
// micro-batch in flight, the modes and their errors, and the same across Gloo ranks
// (pipeline_worker.cpp) against one device.
#include "test_util.h"

#include "core/allocator.h"
#include "core/trace.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/models/resnet.h"
#include "nn/sequential.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/process_group/process_group_gloo.h"
#include "pipeline_models.h"
#include "spawn_ranks.h"

using namespace weft;
using namespace weft::parallel::pipeline;
using doctest::Contains;

namespace {

Tensor cross_entropy_loss(const Tensor& output, const Tensor& target) { return cross_entropy(output, target); }

// The MLP of the pipeline tests with a Dropout after each ReLU: 10 layers.
std::shared_ptr<nn::Sequential> mlp_with_dropout() {
  auto mlp = test::make_mlp(7);
  auto model = std::make_shared<nn::Sequential>();
  for (const auto& [name, layer] : mlp->named_children()) {
    model->push_back(layer);
    if (layer->type_name() == "ReLU") model->push_back(std::make_shared<nn::Dropout>(0.3));
  }
  return model;
}

// 6 SGD steps of a pipeline over `model`'s copy from generators seeded alike (`own`, a
// Dropout's generator of its own, too): the losses of every step, then the model's parameters
// and buffers; and how many forwards ran again (the trace's "recompute" spans).
struct Run {
  std::vector<Tensor> values;
  size_t recomputed = 0;
};
Run train_six_steps(const std::shared_ptr<nn::Sequential>& model, PipelineOptions options, const Shape& sample,
                    Generator* own = nullptr) {
  manual_seed(21);
  if (own) own->manual_seed(22);
  auto copy = std::dynamic_pointer_cast<nn::Sequential>(model->clone());
  Pipeline pipe(copy, std::move(options));
  optim::SGD sgd(pipe.parameters(), optim::SGDOptions{0.05, 0.9});
  Run run;
  Shape shape = sample;
  shape.insert(0, 12);
  trace::start();
  for (int s = 0; s < 6; ++s) {
    Generator gen(500 + s);
    Tensor x = randn(shape, DType::Float64, &gen);
    Tensor y = randint(0, 10, {12}, DType::Int64, &gen);
    sgd.zero_grad();
    run.values.push_back(pipe.step(x, y, cross_entropy_loss).loss.to(kCPU));
    sgd.step();
  }
  trace::stop();
  const std::string json = trace::json();
  for (size_t at = json.find("\"recompute\""); at != std::string::npos; at = json.find("\"recompute\"", at + 1))
    ++run.recomputed;
  for (const auto& [name, t] : copy->state_dict()) run.values.push_back(t.to(kCPU));
  return run;
}

void check_same(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    CHECK_CLOSE(actual[i], expected[i], 0, 0);  // the same operations on the same values
  }
}

}  // namespace

TEST_CASE("activation checkpointing: recomputed micro-batches give the plain pipeline's losses and weights") {
  // Dropout: the second forward must draw the first one's masks (each stage's device has a
  // generator of its own), and the generator must go on from where the plain run's does.
  // Recomputed per step, 3 stages and 4 micro-batches: GPipe every (stage, micro-batch), or
  // all but the last micro-batch's; 1F1B all but the last stage's, whose backwards come
  // right after their forwards.
  const auto dropout = mlp_with_dropout();
  struct Expect {
    const char* schedule;
    const char* mode;
    size_t per_step;
  };
  for (const Expect& e : {Expect{"gpipe", "except_last", 9}, Expect{"gpipe", "always", 12},
                          Expect{"1f1b", "except_last", 6}, Expect{"1f1b", "always", 8}}) {
    CAPTURE(e.schedule);
    CAPTURE(e.mode);
    const PipelineOptions plain{.devices = test::cpu_devices(3), .micro_batches = 4, .schedule = e.schedule};
    PipelineOptions options = plain;
    options.activation_checkpointing = e.mode;
    const Run run = train_six_steps(dropout, options, {8});
    check_same(run.values, train_six_steps(dropout, plain, {8}).values);
    CHECK(run.recomputed == 6 * e.per_step);
  }
  // Interleaved: two stages per device, recomputed on one thread.
  const PipelineOptions interleaved{.devices = test::cpu_devices(2), .micro_batches = 4, .schedule = "interleaved",
                                    .virtual_stages = 2};
  PipelineOptions recomputed = interleaved;
  recomputed.activation_checkpointing = "always";
  const Run run = train_six_steps(dropout, recomputed, {8});
  check_same(run.values, train_six_steps(dropout, interleaved, {8}).values);
  CHECK(run.recomputed > 0);
  // A Dropout with a generator of its own (on stage 1 only: one thread draws from it).
  Generator own(22);
  auto owned = test::make_mlp(7);
  auto with_own = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i < owned->size(); ++i) {
    with_own->push_back(owned->named_children()[i].second);
    if (i == 4) with_own->push_back(std::make_shared<nn::Dropout>(0.3, &own));
  }
  const PipelineOptions two{.devices = test::cpu_devices(2), .balance = {4, 4}, .micro_batches = 4};
  PipelineOptions two_recomputed = two;
  two_recomputed.activation_checkpointing = "always";
  check_same(train_six_steps(with_own, two_recomputed, {8}, &own).values, train_six_steps(with_own, two, {8}, &own).values);
  // BatchNorm: its statistics and counts as the plain pipeline leaves them (the second forward
  // of a micro-batch must not count it again); in evaluation, where its backward reads the
  // statistics it saved, they must not be written at all.
  for (bool training : {true, false}) {
    CAPTURE(training);
    auto resnet = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1});
    resnet->to(DType::Float64);
    if (!training) resnet->eval();
    const PipelineOptions bn{.devices = test::cpu_devices(2), .micro_batches = 3, .schedule = "1f1b"};
    PipelineOptions bn_recomputed = bn;
    bn_recomputed.activation_checkpointing = "always";
    check_same(train_six_steps(resnet->as_sequential(), bn_recomputed, {1, 8, 8}).values,
               train_six_steps(resnet->as_sequential(), bn, {1, 8, 8}).values);
  }
}

TEST_CASE("activation checkpointing: a stage holds one micro-batch's activations, not one per micro-batch") {
  // Stage 0 (test::make_wide_then_narrow's) under GPipe with micro-batches of 8 samples:
  // without recomputation its peak grows with every micro-batch, whose activations it holds
  // until the backwards; recomputing, by the 8 x 8 input alone. Growths from 2 to 8
  // micro-batches are compared: the peak also holds transients that do not depend on them (a
  // 512 x 512 weight gradient before it is added to .grad).
  auto peak = [](const char* mode, int m) {
    Generator gen(3);
    Pipeline pipe(test::make_wide_then_narrow(&gen), {.devices = test::cpu_devices(4), .balance = {5, 1, 1, 1},
                                                      .micro_batches = m, .schedule = "gpipe",
                                                      .activation_checkpointing = mode});
    Tensor x = randn({8 * m, 8}, DType::Float64, &gen);
    Tensor y = randint(0, 10, {8 * m}, DType::Int64, &gen);
    return test::step_peak_above(pipe, x, y, cross_entropy_loss, Device::cpu(0));
  };
  const int64_t never = peak("never", 8) - peak("never", 2), always = peak("always", 8) - peak("always", 2);
  const int64_t except_last = peak("except_last", 8) - peak("except_last", 2);
  MESSAGE("stage 0 peak, growth from 2 to 8 micro-batches of 8 samples (GPipe): never ", never, " B, except_last ",
          except_last, " B, always ", always, " B");
  CHECK(never >= 6 * 2 * 8 * 512 * 8);  // at least two 8 x 512 activations per micro-batch
  CHECK(always * 10 < never);
  CHECK(except_last * 10 < never);
}

TEST_CASE("activation checkpointing: the modes, and an unknown one named") {
  CHECK(recomputed_micro_batches("never", 4) == 0);
  CHECK(recomputed_micro_batches("except_last", 4) == 3);
  CHECK(recomputed_micro_batches("always", 4) == 4);
  CHECK_THROWS_WITH(Pipeline(test::make_mlp(1), {.devices = test::cpu_devices(2), .activation_checkpointing = "often"}),
                    Contains("activation_checkpointing must be never, except_last or always, got 'often'"));
}

TEST_CASE("distributed pipeline: recomputed micro-batches on Gloo ranks equal one device") {
  if (!parallel::gloo_available()) {
    MESSAGE("skipped: weft was built without Gloo");
    return;
  }
  for (const char* schedule : {"gpipe", "1f1b"}) {
    CAPTURE(schedule);
    const auto outcomes =
        test::run_ranks({WEFT_PIPELINE_WORKER, schedule, "4", "1", "always"}, 2, std::chrono::seconds(120));
    test::check_all_ok(outcomes);
    for (const auto& outcome : outcomes)
      CHECK_MESSAGE(outcome.output.find("activation checkpointing always") != std::string::npos, outcome.output);
  }
}
