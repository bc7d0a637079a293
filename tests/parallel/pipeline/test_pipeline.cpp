// Pipelines on logical CPU devices: the built-in schedules' tables against hand-written
// ones and their bubbles against the theory, the validator's rejections, equivalence with
// one device (2, 3 and 4 stages, 1, 4 and 7 micro-batches, every schedule, 20 steps; an
// MLP, ConvNet, ResNet and GPT as Sequentials), activation memory bounded by the micro-batches
// in flight, plain model parallelism (one model's layers split over two devices), errors
// that name the stage, state_dict names, one trace span per action, the headers sent ahead of
// tensors, and the multi-process form (ranks started as processes, pipeline_worker.cpp)
// against one device, alone and as two pipelines replicated over data-parallel groups.
#include "test_util.h"

#include <filesystem>
#include <functional>
#include <memory>
#include <utility>

#include "core/allocator.h"
#include "core/trace.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/models/convnet.h"
#include "nn/models/gpt.h"
#include "nn/models/resnet.h"
#include "nn/sequential.h"
#include "parallel/pipeline/distributed_pipeline.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/tensor_header.h"
#include "parallel/process_group/process_group_gloo.h"
#include "pipeline_models.h"
#include "spawn_ranks.h"

using namespace weft;
using namespace weft::parallel::pipeline;
using doctest::Contains;

namespace {

Tensor cross_entropy_loss(const Tensor& output, const Tensor& target) { return cross_entropy(output, target); }

// Step s's batch (input, target).
using BatchOf = std::function<std::pair<Tensor, Tensor>(int step)>;

// Trains `reference` on cpu:0 and a copy of it as a pipeline, from the same weights on the
// same batches, and compares the losses at every step and the parameters at the end.
void check_equivalent(const std::shared_ptr<nn::Sequential>& reference, PipelineOptions options,
                      const BatchOf& batch_of, const nn::Criterion& criterion, int steps, double tol) {
  CAPTURE(options.schedule);
  CAPTURE(options.devices.size());
  CAPTURE(options.virtual_stages);
  CAPTURE(options.micro_batches);
  auto copy = std::dynamic_pointer_cast<nn::Sequential>(reference->clone());
  Pipeline pipe(copy, options);
  optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD sgd_pipe(pipe.parameters(), optim::SGDOptions{0.05, 0.9});
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = batch_of(s);
    sgd_ref.zero_grad();
    Tensor out = reference->forward(x);
    Tensor expected_loss = criterion(out, y);
    expected_loss.backward();
    sgd_ref.step();

    sgd_pipe.zero_grad();
    StepResult result = pipe.step(x, y, criterion);
    sgd_pipe.step();
    CHECK(result.loss.device() == options.devices[(pipe.num_stages() - 1) % options.devices.size()]);
    CHECK_CLOSE(result.loss.to(kCPU), expected_loss.detach(), tol, tol);
    CHECK_CLOSE(result.output.to(kCPU), out.detach(), tol, tol);
  }
  auto expected = reference->named_parameters(), actual = pipe.named_parameters();
  REQUIRE(expected.size() == actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(actual[i].first == expected[i].first);
    CHECK_CLOSE(actual[i].second.to(kCPU), expected[i].second, tol, tol);
  }
}

// Batches of `batch` samples shaped `sample` (normal, the parameters' dtype) with class targets.
void check_equivalent(const std::shared_ptr<nn::Sequential>& reference, PipelineOptions options, const Shape& sample,
                      int64_t batch, int steps, double tol) {
  Shape shape = sample;
  shape.insert(0, batch);
  const DType dtype = reference->parameters()[0].dtype();
  auto batch_of = [&](int s) {
    Generator gen(1000 + s);
    Tensor x = randn(shape, TensorOptions(dtype), &gen);
    return std::pair(x, randint(0, 10, {batch}, DType::Int64, &gen));
  };
  check_equivalent(reference, std::move(options), batch_of, cross_entropy_loss, steps, tol);
}

// A schedule's rank r actions, without communication, from compact text: "F0 F1 B0 B1".
std::vector<Action> computations(int stage, const std::string& text) {
  std::vector<Action> out;
  std::istringstream in(text);
  for (std::string word; in >> word;)
    out.push_back({word[0] == 'F' ? ActionKind::Forward : ActionKind::Backward, stage, std::stoi(word.substr(1))});
  return out;
}

}  // namespace

TEST_CASE("schedules: GPipe, 1F1B and interleaved tables for 4 stages and 8 micro-batches") {
  CHECK(gpipe(4, 8).table() ==
        "stage 0: F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  .  .  B0 B1 B2 B3 B4 B5 B6 B7\n"
        "stage 1: .  F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  B0 B1 B2 B3 B4 B5 B6 B7 .\n"
        "stage 2: .  .  F0 F1 F2 F3 F4 F5 F6 F7 .  .  B0 B1 B2 B3 B4 B5 B6 B7 .  .\n"
        "stage 3: .  .  .  F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7 .  .  .\n");
  CHECK(one_f_one_b(4, 8).table() ==
        "stage 0: F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7\n"
        "stage 1: .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .\n"
        "stage 2: .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .\n"
        "stage 3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  .\n");
  // Stages 0-3 and 4-7 on ranks 0-3: micro-batches go round a rank's two stages in groups
  // of 4; cells say stage, kind, micro-batch.
  CHECK(interleaved_one_f_one_b(4, 2, 8).table() ==
        "rank 0: 0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 0F6 4B0 0F7 4B1 .   .   4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 0B2 "
        "0B3 .   4B4 .   4B5 .   4B6 .   4B7 0B4 0B5 0B6 0B7\n"
        "rank 1: .   1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 1B3 "
        ".   5B4 .   5B5 .   5B6 .   5B7 1B4 1B5 1B6 1B7 .\n"
        "rank 2: .   .   2F0 2F1 2F2 2F3 6F0 6F1 6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 "
        "6B4 6F7 6B5 .   6B6 .   6B7 2B4 2B5 2B6 2B7 .   .\n"
        "rank 3: .   .   .   3F0 3F1 3F2 3F3 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 7F4 7B4 "
        "7F5 7B5 7F6 7B6 7F7 7B7 3B4 3B5 3B6 3B7 .   .   .\n");
  // The communication between: stage 1's first actions under 1F1B.
  const Schedule schedule = one_f_one_b(4, 8);
  const auto& rank1 = schedule.actions[1];
  std::string head;
  for (size_t i = 0; i < 6; ++i) head += rank1[i].str() + " ";
  CHECK(head == "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 ");
}

TEST_CASE("schedules: the replayed bubble equals the theory") {
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 4, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      const double theory = static_cast<double>(p - 1) / (m + p - 1);
      CHECK(timeline(gpipe(p, m)).bubble_fraction() == doctest::Approx(theory));
      CHECK(timeline(one_f_one_b(p, m)).bubble_fraction() == doctest::Approx(theory));
      if (m % p == 0)
        for (int v : {2, 3})
          CHECK(timeline(interleaved_one_f_one_b(p, v, m)).bubble_fraction() ==
                doctest::Approx(static_cast<double>(p - 1) / (v * m + p - 1)));
    }
  CHECK_THROWS_WITH(interleaved_one_f_one_b(4, 2, 6), Contains("must be a multiple of the ranks"));
  CHECK_THROWS_WITH(make_schedule("zigzag", 2, 4), Contains("unknown (expected gpipe, 1f1b or interleaved)"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 2, 4, 2), Contains("for the interleaved schedule only"));
}

TEST_CASE("validator: accepts a hand-written schedule and rejects broken ones naming the action") {
  // Two stages, two micro-batches, the second rank's backwards in reverse order: valid.
  Schedule mine{"mine", 2, 2, {with_communication(computations(0, "F0 F1 B1 B0"), 2),
                              with_communication(computations(1, "F0 F1 B1 B0"), 2)}};
  CHECK_NOTHROW(validate(mine));

  Schedule early = mine;
  early.actions[1] = with_communication(computations(1, "F0 B1 F1 B0"), 2);
  CHECK_THROWS_WITH(validate(early), Contains("rank 1's action 2 (1B1): a backward before its forward (1F1)"));

  Schedule missing_recv = mine;  // rank 1 never receives micro-batch 1's activation
  auto& list = missing_recv.actions[1];
  list.erase(std::find(list.begin(), list.end(), Action{ActionKind::RecvForward, 1, 1}));
  CHECK_THROWS_WITH(validate(missing_recv), Contains("(1F1): a forward before the receive of its input (1RECV_F1)"));

  Schedule no_recv = mine;  // rank 1 never receives it, nor runs what needs it
  no_recv.actions[1] = with_communication(computations(1, "F0 B0"), 2);
  CHECK_THROWS_WITH(validate(no_recv), Contains("rank 1 never runs 1F1"));

  Schedule unmatched = mine;  // an extra send nobody receives
  unmatched.actions[1].push_back({ActionKind::SendBackward, 1, 1});
  CHECK_THROWS_WITH(validate(unmatched), Contains("repeated"));

  // Rank 0 waits for micro-batch 0's gradient before it sends micro-batch 1's activation,
  // which rank 1 needs before it runs any backward: each waits for the other.
  Schedule cyclic{"cyclic", 2, 2, {}};
  cyclic.actions.push_back({{ActionKind::Forward, 0, 0}, {ActionKind::SendForward, 0, 0},
                            {ActionKind::Forward, 0, 1}, {ActionKind::RecvBackward, 0, 0},
                            {ActionKind::SendForward, 0, 1}, {ActionKind::Backward, 0, 0},
                            {ActionKind::RecvBackward, 0, 1}, {ActionKind::Backward, 0, 1}});
  cyclic.actions.push_back(with_communication(computations(1, "F0 F1 B0 B1"), 2));
  CHECK_THROWS_WITH(validate(cyclic), Contains("a cyclic wait: rank 0's action 3 (0RECV_B0) waits for 1SEND_B0 on "
                                               "rank 1; rank 1's action 2 (1RECV_F1) waits for 0SEND_F1 on rank 0"));

  Schedule misplaced = mine;
  misplaced.actions[0][0].stage = 1;
  CHECK_THROWS_WITH(validate(misplaced), Contains("rank 0's action 0 (1F0): stage 1 lives on rank 1"));
  CHECK_THROWS_WITH(misplaced.table(), Contains("stage 1 lives on rank 1"));
}

TEST_CASE("pipeline: an MLP over 2, 3 and 4 stages with 1, 4 and 7 micro-batches equals one device") {
  for (int stages : {2, 3, 4})
    for (int m : {1, 4, 7})
      for (const char* schedule : {"gpipe", "1f1b"}) {
        PipelineOptions options{.devices = test::cpu_devices(stages), .micro_batches = m, .schedule = schedule};
        check_equivalent(test::make_mlp(7), options, {8}, 13, 20, 1e-10);
      }
  // Interleaved: two stages per device (m a multiple of the devices).
  for (int devices : {2, 3})
    for (int m : {devices, 2 * devices}) {
      PipelineOptions options{.devices = test::cpu_devices(devices), .micro_batches = m, .schedule = "interleaved",
                              .virtual_stages = 2};
      check_equivalent(test::make_mlp(7), options, {8}, 13, 20, 1e-10);
    }
}

TEST_CASE("pipeline: ConvNet and ResNet as Sequentials, with balance; BatchNorm with one micro-batch") {
  auto convnet = std::make_shared<nn::ConvNet>();
  convnet->to(DType::Float64);
  auto conv_seq = convnet->as_sequential();
  CHECK(conv_seq->forward(test::random({2, 1, 28, 28})).shape() == Shape{2, 10});
  check_equivalent(conv_seq,
                   {.devices = test::cpu_devices(2), .balance = {1, 3}, .micro_batches = 3, .schedule = "1f1b"},
                   {1, 28, 28}, 6, 3, 1e-10);
  auto resnet = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1});
  resnet->to(DType::Float64);
  check_equivalent(resnet->as_sequential(), {.devices = test::cpu_devices(3), .micro_batches = 1, .schedule = "gpipe"},
                   {1, 8, 8}, 4, 3, 1e-10);
}

TEST_CASE("pipeline: a GPT split between its blocks, every schedule, equals one device") {
  // Untied: the embedding (stage 0) and the head (the last stage) cannot share a weight.
  const nn::GPTConfig config{.vocab_size = 13, .block_size = 6, .n_layer = 3, .n_head = 2, .n_embd = 8,
                             .tie_embeddings = false};
  auto batch_of = [](int s) {
    Generator gen(2000 + s);
    return std::pair(randint(0, 13, {6, 6}, DType::Int64, &gen), randint(0, 13, {6, 6}, DType::Int64, &gen));
  };
  for (const char* schedule : {"gpipe", "1f1b", "interleaved"}) {
    Generator gen(21);
    auto gpt = std::make_shared<nn::GPT>(config, DType::Float64, &gen);
    const bool interleaved = std::string(schedule) == "interleaved";
    PipelineOptions options{.devices = test::cpu_devices(2), .micro_batches = interleaved ? 2 : 3,
                            .schedule = schedule, .virtual_stages = interleaved ? 2 : 1};
    check_equivalent(gpt->as_sequential(), options, batch_of, nn::next_token_loss, 5, 1e-10);
  }
}

TEST_CASE("pipeline: activations held per stage are bounded by the micro-batches in flight") {
  // Stage 0's peak memory above its parameters, with micro-batches of 8 samples: GPipe keeps
  // every micro-batch's activations until the backwards, 1F1B at most `stages` of them.
  // Stage 0 is wide and hands on a narrow output, so that its activations dominate what
  // the stages send each other.
  auto peak = [](const char* schedule, int m) {
    Generator gen(3);
    Pipeline pipe(test::make_wide_then_narrow(&gen),
                  {.devices = test::cpu_devices(4), .balance = {5, 1, 1, 1}, .micro_batches = m, .schedule = schedule});
    Tensor x = randn({8 * m, 8}, DType::Float64, &gen);
    Tensor y = randint(0, 10, {8 * m}, DType::Int64, &gen);
    return test::step_peak_above(pipe, x, y, cross_entropy_loss, Device::cpu(0));
  };
  const int64_t one = peak("gpipe", 1);
  const int64_t gpipe4 = peak("gpipe", 4), gpipe16 = peak("gpipe", 16);
  const int64_t f1b4 = peak("1f1b", 4), f1b16 = peak("1f1b", 16);
  MESSAGE("stage 0 peak above parameters and gradients: 1 micro-batch ", one, " B; GPipe 4: ", gpipe4, ", 16: ",
          gpipe16, "; 1F1B 4: ", f1b4, ", 16: ", f1b16);
  const int64_t per_micro_batch = (gpipe4 - one) / 3;  // the activations one micro-batch leaves
  CHECK(per_micro_batch > 0);
  CHECK(gpipe16 >= gpipe4 + 11 * per_micro_batch);     // GPipe: grows with every micro-batch
  CHECK(f1b16 <= f1b4 + per_micro_batch / 2);           // 1F1B: does not grow with them,
  CHECK(f1b4 <= gpipe4 + per_micro_batch / 2);          // holding at most `stages` (4) of them
}

TEST_CASE("plain model parallelism: a model split over two devices trains as on one device") {
  // forward() runs stage after stage with differentiable copies between devices; the
  // gradients flow back to each layer's device.
  auto reference = test::make_mlp(11);
  auto copy = std::dynamic_pointer_cast<nn::Sequential>(reference->clone());
  Pipeline pipe(copy, {.devices = test::cpu_devices(2), .balance = {3, 4}});
  Tensor x = test::random({5, 8});
  Tensor y = tensor(std::vector<int64_t>{1, 2, 3, 4, 5});
  Tensor out = pipe.forward(x);
  CHECK(out.device() == Device::cpu(1));
  cross_entropy(out, y.to(Device::cpu(1))).backward();
  cross_entropy(reference->forward(x), y).backward();
  auto expected = reference->named_parameters(), actual = pipe.named_parameters();
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(actual[i].second.grad().device() == (i < 4 ? Device::cpu(0) : Device::cpu(1)));  // layers 0-2 | 3-6
    CHECK_CLOSE(actual[i].second.grad().to(kCPU), expected[i].second.grad(), 1e-12, 1e-12);
  }
  // Mixing devices in one op is an error that says how to fix it.
  CHECK_THROWS_WITH(add(x, x.to(Device::cpu(1))), Contains("expected all tensors on one device, got cpu:0 and cpu:1"));
}

TEST_CASE("pipeline: state_dict names are the Sequential's, and checkpoints move both ways") {
  auto single = test::make_mlp(1);
  auto names = [](const nn::NamedTensors& s) {
    std::vector<std::string> out;
    for (const auto& [n, t] : s) out.push_back(n);
    return out;
  };
  Pipeline pipe(test::make_mlp(2), {.devices = test::cpu_devices(3), .micro_batches = 2});
  CHECK(names(pipe.state_dict()) == names(single->state_dict()));
  pipe.load_state_dict(single->state_dict());
  CHECK(pipe.stage(2).parameters()[0].device() == Device::cpu(2));
  Tensor x = test::random({4, 8});
  CHECK_CLOSE(pipe.forward(x).to(kCPU), single->forward(x), 1e-14, 1e-14);
  auto back = test::make_mlp(3);
  back->load_state_dict(pipe.state_dict());
  CHECK_CLOSE(back->forward(x), single->forward(x), 1e-14, 1e-14);
}

TEST_CASE("pipeline: bad input and a failing stage give errors naming what is wrong, never a hang") {
  auto model = test::make_mlp(1);
  CHECK_THROWS_WITH(Pipeline(model, {.devices = test::cpu_devices(2), .balance = {3, 3}}),
                    Contains("balance puts 6 layers in stages; the Sequential has 7"));
  CHECK_THROWS_WITH(Pipeline(test::make_mlp(1), {.devices = {Device::cpu(0), Device::cpu(0)}}),
                    Contains("device cpu:0 is given twice"));
  CHECK_THROWS_WITH(Pipeline(test::make_mlp(1), {.devices = test::cpu_devices(8)}),
                    Contains("8 stages need at least as many layers; the Sequential has 7"));
  Pipeline pipe(test::make_mlp(1), {.devices = test::cpu_devices(2), .micro_batches = 4, .schedule = "1f1b"});
  // An epoch's short last batch (3 samples, 4 micro-batches) runs as 3 micro-batches, and
  // gives the whole batch's loss; a schedule of one's own has no such fallback.
  Tensor y = tensor(std::vector<int64_t>{1, 2, 3});
  Tensor x3 = test::random({3, 8});
  auto reference = test::make_mlp(1);
  CHECK_CLOSE(pipe.step(x3, y, cross_entropy_loss).loss.to(kCPU), cross_entropy(reference->forward(x3), y).detach(),
              1e-12, 1e-12);
  // Interleaved: as many micro-batches as fill a multiple of the devices (2 for 3 samples), and
  // a batch smaller than the devices is an error that says so.
  Pipeline interleaved(test::make_mlp(1), {.devices = test::cpu_devices(2), .micro_batches = 4,
                                           .schedule = "interleaved", .virtual_stages = 2});
  CHECK_CLOSE(interleaved.step(x3, y, cross_entropy_loss).loss.to(kCPU),
              cross_entropy(reference->forward(x3), y).detach(), 1e-12, 1e-12);
  CHECK_THROWS_WITH(interleaved.step(x3.narrow(0, 0, 1), y.narrow(0, 0, 1), cross_entropy_loss),
                    Contains("the interleaved schedule over 2 ranks needs a multiple of 2 micro-batches of at least "
                             "one sample each, but a batch has 1 samples"));
  CHECK(micro_batches_for_batch("interleaved", 2, 4, 7) == 4);
  CHECK(micro_batches_for_batch("interleaved", 3, 6, 5) == 3);
  CHECK(micro_batches_for_batch("gpipe", 2, 4, 3) == 3);
  Pipeline own(test::make_mlp(1), {.devices = test::cpu_devices(2), .micro_batches = 4});
  own.set_schedule(one_f_one_b(2, 4));
  CHECK_THROWS_WITH(own.step(x3, y, cross_entropy_loss), Contains("a batch of 3 cannot be split into 4 micro-batches"));
  {
    NoGradGuard no_grad;
    CHECK_THROWS_WITH(pipe.step(x3, y, cross_entropy_loss), Contains("under NoGradGuard use forward()"));
  }
  // Inputs of the wrong width fail in stage 0; stage 1, waiting for them, stops too.
  Tensor y8 = randint(0, 10, {8}, DType::Int64);
  CHECK_THROWS_WITH(pipe.step(test::random({8, 5}), y8, cross_entropy_loss),
                    Contains("Pipeline::step (schedule 1f1b) on rank 0 (cpu:0)"));
  // A user schedule must match the pipeline.
  CHECK_THROWS_WITH(pipe.set_schedule(gpipe(3, 4)), Contains("has 3 stages on 3 ranks; this pipeline has 2 stages"));
}

TEST_CASE("pipeline: the trace has a span per action on each stage's device") {
  Pipeline pipe(test::make_mlp(1), {.devices = test::cpu_devices(2), .micro_batches = 2, .schedule = "1f1b"});
  trace::start();
  pipe.step(test::random({4, 8}), randint(0, 10, {4}, DType::Int64), cross_entropy_loss);
  trace::stop();
  const std::string json = trace::json();
  for (const char* name : {"\"0F0\"", "\"0F1\"", "\"0B0\"", "\"0SEND_F1\"", "\"1RECV_F0\"", "\"1B1\"", "\"1SEND_B1\""})
    CHECK_MESSAGE(json.find(name) != std::string::npos, name);
}

TEST_CASE("tensor headers: dtype and shape travel, no tensor says so, and a bad header is named") {
  for (const Tensor& t : {zeros({2, 3, 4}, DType::Float32), zeros({}, DType::Int64), zeros({0, 5}, DType::Float16)}) {
    CAPTURE(t.shape());
    const std::optional<Tensor> back = empty_from_header(tensor_header(t, kCPU), kCPU, "test");
    REQUIRE(back.has_value());
    CHECK(back->shape() == t.shape());
    CHECK(back->dtype() == t.dtype());
  }
  CHECK(!empty_from_header(tensor_header(Tensor(), kCPU), kCPU, "test").has_value());
  CHECK(!empty_from_header(tensor_header(zeros({1, 1, 1, 1, 1, 1, 1}), kCPU), kCPU, "test").has_value());  // 7 dims
  Tensor bad = tensor_header(zeros({2, 3}), kCPU);
  bad.data_ptr<int64_t>()[1] = 9;
  CHECK_THROWS_WITH(empty_from_header(bad, kCPU, "rank 1's 0SEND_F2"),
                    Contains("rank 1's 0SEND_F2 got a bad header (9 dims)"));
  bad = tensor_header(zeros({2, 3}), kCPU);
  bad.data_ptr<int64_t>()[3] = -4;
  CHECK_THROWS_WITH(empty_from_header(bad, kCPU, "x"), Contains("x got a bad header (size -4 in dim 1)"));
  bad = tensor_header(zeros({2, 3}), kCPU);
  bad.data_ptr<int64_t>()[0] = kNumDTypes;
  CHECK_THROWS_WITH(empty_from_header(bad, kCPU, "x"), Contains("x got a bad header (dtype 8)"));
}

TEST_CASE("distributed pipeline: one stage per process (Gloo), each schedule, equals one device") {
  if (!parallel::gloo_available()) {
    MESSAGE("skipped: weft was built without Gloo");
    return;
  }
  struct Run {
    int ranks;
    std::vector<std::string> args;
  };
  for (const Run& run : {Run{2, {"gpipe", "1"}}, Run{2, {"gpipe", "4"}}, Run{2, {"1f1b", "7"}}, Run{3, {"1f1b", "4"}},
                         Run{3, {"gpipe", "7"}}, Run{2, {"interleaved", "4", "2"}}}) {
    std::vector<std::string> argv{WEFT_PIPELINE_WORKER};
    argv.insert(argv.end(), run.args.begin(), run.args.end());
    CAPTURE(run.ranks);
    CAPTURE(run.args[0]);
    CAPTURE(run.args[1]);
    const auto outcomes = test::run_ranks(argv, run.ranks, std::chrono::seconds(120));
    test::check_all_ok(outcomes);
    for (const auto& outcome : outcomes)
      CHECK_MESSAGE(outcome.output.find("parameters of stages checked") != std::string::npos, outcome.output);
  }
}

TEST_CASE("distributed pipeline: a TrainLoop resumed on another number of ranks equals one device") {
  if (!parallel::gloo_available()) {
    MESSAGE("skipped: weft was built without Gloo");
    return;
  }
  // Note [A pipeline TrainLoop resumed on other ranks] (pipeline_worker.cpp), then pipelines
  // replicated (Note [Replicated pipelines in the TrainLoop]): 2 pipelines of 2 stages resumed
  // as 4 replicas of one stage, and 2 replicas of one stage resumed as 2 interleaved pipelines.
  struct Phase {
    int ranks;
    std::vector<std::string> args;  // phase, optimizer, schedule, micro-batches, stages per rank
    std::string replicas;
  };
  const std::string checkpoint =
      (std::filesystem::temp_directory_path() / ("weft_pipeline_loop_" + std::to_string(::getpid()) + ".st")).string();
  for (const auto& [first, rest] :
       {std::pair{Phase{2, {"first", "sgd", "1f1b", "4", "1"}, "1"}, Phase{3, {"rest", "sgd", "gpipe", "2", "1"}, "1"}},
        std::pair{Phase{3, {"first", "adam", "interleaved", "3", "2"}, "1"},
                  Phase{2, {"rest", "adam", "1f1b", "4", "1"}, "1"}},
        std::pair{Phase{4, {"first", "sgd", "1f1b", "2", "1"}, "2"}, Phase{4, {"rest", "sgd", "gpipe", "3", "1"}, "4"}},
        std::pair{Phase{2, {"first", "adam", "1f1b", "4", "1"}, "2"},
                  Phase{4, {"rest", "adam", "interleaved", "2", "2"}, "2"}}}) {
    for (const Phase& phase : {first, rest}) {
      std::vector<std::string> argv{WEFT_PIPELINE_WORKER, "loop"};
      argv.insert(argv.end(), phase.args.begin(), phase.args.end());
      argv.push_back(checkpoint);
      argv.push_back(phase.replicas);
      argv.push_back(first.replicas);  // the checkpoint's
      CAPTURE(phase.ranks);
      CAPTURE(phase.args[0]);
      CAPTURE(phase.args[1]);
      CAPTURE(phase.replicas);
      const auto outcomes = test::run_ranks(argv, phase.ranks, std::chrono::seconds(120));
      test::check_all_ok(outcomes);
      if (phase.args[0] == "rest")
        for (const auto& outcome : outcomes)
          CHECK_MESSAGE(outcome.output.find("(" + phase.replicas + " replicas) matches one device") !=
                            std::string::npos,
                        outcome.output);
    }
  }
  std::filesystem::remove(checkpoint);
}

TEST_CASE("replicated pipelines: every replica ends an epoch with replica 0's BatchNorm statistics") {
  if (!parallel::gloo_available()) return;
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-buffers"}, 4, std::chrono::seconds(120));
  test::check_all_ok(outcomes);
  for (const auto& outcome : outcomes)
    CHECK_MESSAGE(outcome.output.find("tensors equal on every rank") != std::string::npos, outcome.output);
}

TEST_CASE("replicated pipelines: replicas that build different stages fail at construction, naming the tensor") {
  if (!parallel::gloo_available()) return;
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-mismatch"}, 4, std::chrono::seconds(60));
  // Position 1's ranks say how their stages differ; position 0's that position 1's do.
  test::check_all_said(outcomes, [](size_t r) -> std::vector<std::string> {
    if (r >= 2)
      return {"the replicas of pipeline position 1 hold different stages: on rank 0, stage 1 6.weight [10, 16] "
              "float64; on rank 1, stage 1 6.weight [12, 16] float64"};
    return {"the replicas of pipeline position 1 hold different stages (the errors of those ranks say how"};
  });
}

TEST_CASE("replicated pipelines: replicas that ask for other options fail at construction, naming the field") {
  if (!parallel::gloo_available()) return;
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-options"}, 4, std::chrono::seconds(60));
  test::check_all_said(outcomes, [](size_t r) -> std::vector<std::string> {
    return {"DistributedPipeline: ranks disagree: rank " + std::to_string(r), "micro_batches"};
  });
}

TEST_CASE("replicated pipelines: a pipeline whose ranks disagree on their counts fails every rank") {
  if (!parallel::gloo_available()) return;
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-counts"}, 4, std::chrono::seconds(60));
  test::check_all_said(outcomes, [](size_t r) -> std::vector<std::string> {
    if (r % 2 == 1) return {"the ranks of a pipeline disagree on counts they hold alike"};
    return {"the ranks of 1 other pipeline disagree on the counts of their batches"};
  });
}

TEST_CASE("replicated pipelines: balance_by measures once, on rank 0, for every replica") {
  if (!parallel::gloo_available()) return;
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-balance"}, 4, std::chrono::seconds(60));
  test::check_all_ok(outcomes);
  for (const auto& outcome : outcomes)
    CHECK_MESSAGE(outcome.output.find("split 1+6 as rank 0 answered") != std::string::npos, outcome.output);
}

TEST_CASE("distributed pipeline: broadcast_stages carries BatchNorm's statistics and counts to every rank") {
  if (!parallel::gloo_available()) return;
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    test::check_all_ok(test::run_ranks({WEFT_PIPELINE_WORKER, "buffers"}, ranks, std::chrono::seconds(120)));
  }
}

TEST_CASE("two dimensions: pipelines of two ranks, each stage averaged over its replicas during the backward, "
          "equal one device") {
  if (!parallel::gloo_available()) return;
  // Note [Two dimensions: pipelines replicated over data-parallel groups] (pipeline_worker.cpp).
  for (const char* schedule : {"1f1b", "interleaved"}) {
    CAPTURE(schedule);
    const auto outcomes =
        test::run_ranks({WEFT_PIPELINE_WORKER, "two-dimensions", schedule}, 4, std::chrono::seconds(120));
    test::check_all_ok(outcomes);
    for (const auto& outcome : outcomes)
      CHECK_MESSAGE(outcome.output.find("10 steps equal one device") != std::string::npos, outcome.output);
  }
}

TEST_CASE("replicated pipelines: a stage's trainable parameter without a gradient is named by its replicas, and "
          "found with find_unused_parameters") {
  if (!parallel::gloo_available()) return;
  auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-unused"}, 4, std::chrono::seconds(60));
  test::check_all_said(outcomes, [](size_t r) -> std::vector<std::string> {
    if (r >= 2) return {"parameter(s) '7.ignored' received no gradient in this backward"};
    return {"stepped"};
  });
  // With the flag every rank steps; a parameter frozen after construction then fails every rank.
  outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "replica-unused", "find-unused"}, 4, std::chrono::seconds(60));
  test::check_all_said(outcomes, [](size_t) -> std::vector<std::string> {
    return {"stepped", "trainable parameters, but"};
  });
}

TEST_CASE("distributed pipeline: ranks that disagree on the options fail at construction, naming the field") {
  if (!parallel::gloo_available()) return;
  const auto outcomes = test::run_ranks({WEFT_PIPELINE_WORKER, "mismatch"}, 2, std::chrono::seconds(60));
  test::check_all_said(outcomes, [](size_t) -> std::vector<std::string> {
    return {"DistributedPipeline: ranks disagree", "micro_batches"};
  });
}

TEST_CASE("distributed pipeline: a schedule whose messages would arrive out of order is refused") {
  // Rank 0 sends micro-batch 1's activation before micro-batch 0's; rank 1 takes 0 first.
  Schedule swapped{"swapped", 2, 2, {}};
  swapped.actions.push_back(with_communication(
      {{ActionKind::Forward, 0, 1}, {ActionKind::Forward, 0, 0}, {ActionKind::Backward, 0, 0},
       {ActionKind::Backward, 0, 1}},
      2));
  swapped.actions.push_back(with_communication(computations(1, "F0 F1 B0 B1"), 2));
  CHECK_NOTHROW(validate(swapped));  // fine in one process
  CHECK_THROWS_WITH(check_messages_in_order(swapped),
                    Contains("rank 0's message 0 to rank 1 is 0SEND_F1, but rank 1 receives 0SEND_F0 then"));
  CHECK_NOTHROW(check_messages_in_order(interleaved_one_f_one_b(4, 2, 8)));
  CHECK_NOTHROW(check_messages_in_order(one_f_one_b(4, 8)));
}
