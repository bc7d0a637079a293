// One rank of the multi-process pipeline tests (test_pipeline.cpp starts several):
//
//   pipeline_worker SCHEDULE MICRO_BATCHES [VIRTUAL_STAGES [ACTIVATION_CHECKPOINTING]]
//                                 (RANK, WORLD_SIZE, MASTER_* set)
//   pipeline_worker mismatch      (rank 1 asks for other micro-batches: every rank must fail)
//   pipeline_worker buffers       (broadcast_stages with BatchNorm's buffers)
//   pipeline_worker balance       (balance_by: rank 0's answer on every rank; by_time alike)
//   pipeline_worker balance-fails (balance_by throws on rank 0: every rank must fail)
//   pipeline_worker two-dimensions [SCHEDULE] (4 ranks: Note [Two dimensions: pipelines replicated
//                                 over data-parallel groups])
//   pipeline_worker loop first|rest sgd|adam SCHEDULE MICRO_BATCHES VIRTUAL_STAGES CHECKPOINT REPLICAS
//                                 [REPLICAS_BEFORE]
//                                 (a TrainLoop: Note [A pipeline TrainLoop resumed on other ranks])
//   pipeline_worker replica-buffers (4 ranks: a TrainLoop of 2 replicated pipelines with BatchNorm)
//   pipeline_worker replica-mismatch (4 ranks: replica 1 builds another last layer: all fail)
//   pipeline_worker replica-balance (4 ranks: balance_by measured once for both replicas)
//   pipeline_worker replica-counts (4 ranks: one pipeline's ranks disagree on counts: all fail)
//   pipeline_worker replica-options (4 ranks: the replicas ask for other micro-batches: all fail)
//   pipeline_worker replica-unused [find-unused] (4 ranks: a stage's unused parameter is named by
//                                 its replicas; found with find_unused_parameters)
//
// Every rank builds the whole model from the same seed and trains it alone on one device as
// the reference, and its stages of it as a DistributedPipeline; both see the same batches
// (a function of the step). After 20 steps each rank checks its stages' parameters against
// the reference's of the same names, and the last stage's rank the loss of every step.
// Prints "FAIL: ..." lines and exits 1 on a failure. WEFT_TEST_BACKEND=nccl runs on CUDA.
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>

#include <weft.h>

#include "parallel/pipeline/balance.h"
#include "parallel/pipeline/distributed_pipeline.h"
#include "parallel/pipeline/pipeline_mesh.h"
#include "parallel/process_group/text_collectives.h"
#include "pipeline_models.h"
#include "trace_reading.h"
#include "train/distributed_strategy.h"
#include "train/train_loop.h"
#include "worker_backend.h"

using namespace weft;
using namespace weft::parallel;

namespace {

// The TrainLoop's strategy for `replicas` replicas of a pipeline over the job's other ranks.
train::DistributedStrategyOptions pipelined(Device device, int replicas, train::PipelineAxisOptions axis) {
  return {.device = device,
          .plan = {.pp = parallel::ParallelPlan::kRest, .dp_replicate = replicas},
          .pipeline = std::move(axis)};
}

// The parameters of `got` that differ by more than 1e-10 from those of `want` of the same
// names (or that `want` lacks), each said in a FAIL line.
int count_differing(const nn::NamedTensors& got, const nn::NamedTensors& want, int rank) {
  int failures = 0;
  for (const auto& [name, value] : got) {
    const std::string& key = name;  // Clang 14 cannot capture a structured binding
    const auto it = std::find_if(want.begin(), want.end(), [&](const auto& p) { return p.first == key; });
    const double diff = it == want.end() ? 1.0 : amax(abs(sub(value, it->second))).item();
    if (diff > 1e-10)
      std::cout << "FAIL: rank " << rank << ": parameter " << name << " differs by " << diff << std::endl, ++failures;
  }
  return failures;
}

// How far apart the ranks of the default group hold `t` (0: the same values on every rank): the
// maximum and the minimum over the ranks, each against this rank's (a collective).
double spread_over_ranks(const Tensor& t, Device device) {
  Tensor mine = t.to(DType::Float64).to(device);
  Tensor high = mine.clone(), low = neg(mine);
  default_group().all_reduce(high, ReduceOp::Max)->wait();
  default_group().all_reduce(low, ReduceOp::Max)->wait();
  return std::max(amax(abs(sub(high, mine))).item(), amax(abs(add(low, mine))).item());
}

// For the scenarios in which every rank must fail, once it has joined the group: 0 when `act`
// throws, said in an "error:" line; 1 with a FAIL line saying that the rank `did` what it
// should not have.
int must_fail(const std::string& did, const std::function<void()>& act) {
  try {
    act();
    std::cout << "FAIL: rank " << get_rank() << " " << did << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    destroy_process_group();
    return 0;
  }
}

// Note [A pipeline TrainLoop resumed on other ranks]: a TrainLoop over the ranks' stages
// (train::DistributedStrategy with a pipelined plan) trains the MLP on 64 samples in batches of 12 (the last
// one short) with a validation set and a checkpoint every 2 steps. Phase "first" stops at its
// first checkpoint; phase "rest" starts from that file, perhaps on another number of ranks,
// with another schedule or another number of replicas, and trains to the end of epoch 2. A
// TrainLoop on one device in this process, uninterrupted, is the reference: the epochs'
// losses, the validation, and the whole model and optimizer state that every rank holds at the
// end must agree with it. The checkpoint must therefore have held every rank's stages and
// optimizer state. With R replicas (Note [Replicated pipelines in the TrainLoop]) each replica
// takes batches of 12 / R: DistributedSampler's shards of a step are together the positions
// [12 k, 12 k + 12) of the epoch's permutation, which the reference takes as its batch k
// through a DistributedSampler of one replica (64 is a multiple of R, so no shard is padded,
// and the last step's 4 samples split evenly), and the replicas' mean loss is the whole
// batch's. Both phases then have replicas (R = 1 loads in RandomSampler's order, as one device).
Tensor cross_entropy_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

// Step s's batch of n samples (8 features, 10 classes), the same on every rank.
std::pair<Tensor, Tensor> batch_of_step(int s, int64_t n, Device device) {
  Generator gen(1000 + s);
  Tensor x = randn({n, 8}, TensorOptions(DType::Float64), &gen).to(device);
  return {x, randint(0, 10, {n}, DType::Int64, &gen).to(device)};
}

// One step of the reference model on the whole batch; its loss.
double reference_step(nn::Module& reference, optim::SGD& sgd, const Tensor& x, const Tensor& y) {
  sgd.zero_grad();
  Tensor loss = cross_entropy_of(reference.forward(x), y);
  loss.backward();
  sgd.step();
  return loss.item();
}

// 1, with a FAIL line, when a pipeline's loss at step s is not the reference's.
int loss_differs(int rank, int s, double got, double want) {
  if (std::abs(got - want) <= 1e-10 * (1 + std::abs(want))) return 0;
  std::cout << "FAIL: rank " << rank << ": step " << s << " loss " << got << ", expected " << want << std::endl;
  return 1;
}

int scenario_loop(const std::string& phase, const std::string& optimizer, const std::string& schedule,
                  int micro_batches, int virtual_stages, const std::string& checkpoint, int replicas,
                  int replicas_before) {
  const Device device = test::worker_device();
  Generator gen(5);
  const TensorOptions f64(DType::Float64);
  auto train_set = std::make_shared<data::TensorDataset>(randn({64, 8}, f64, &gen),
                                                         randint(0, 10, {64}, DType::Int64, &gen));
  auto val_set =
      std::make_shared<data::TensorDataset>(randn({25, 8}, f64, &gen), randint(0, 10, {25}, DType::Int64, &gen));
  struct Job {
    std::shared_ptr<nn::Sequential> model;
    std::shared_ptr<optim::Optimizer> optimizer;
    std::unique_ptr<train::TrainLoop> loop;
  };
  auto make_job = [&](std::shared_ptr<train::Strategy> strategy, const std::string& path, int64_t batch_size,
                      bool reference_of_replicas) {
    Job job;
    job.model = test::make_mlp(7);
    if (optimizer == "adam")
      job.optimizer = std::make_shared<optim::Adam>(job.model->parameters(), optim::AdamOptions{.lr = 0.01});
    else
      job.optimizer = std::make_shared<optim::SGD>(job.model->parameters(), optim::SGDOptions{0.05, 0.9});
    train::TrainLoopOptions options;
    options.strategy = std::move(strategy);
    options.checkpoint_path = path;
    options.checkpoint_every = path.empty() ? 0 : 2;
    options.progress = false;
    auto loader = [&](std::shared_ptr<data::Dataset> set, bool shuffle) {
      return std::make_shared<data::DataLoader>(
          set, data::DataLoaderOptions{.batch_size = batch_size, .shuffle = shuffle, .seed = 3});
    };
    // The reference of replicated pipelines takes its batches in DistributedSampler's order.
    auto train_loader = loader(train_set, true);
    if (reference_of_replicas) train_loader = train::shard_loader(*train_loader, /*training=*/true, 1, 0);
    job.loop = std::make_unique<train::TrainLoop>(
        job.model, train_loader, loader(val_set, false), nullptr, job.optimizer,
        [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }, options);
    return job;
  };
  Job reference = make_job(std::make_shared<train::SingleDevice>(device), "", 12, replicas > 1);
  // Epoch 1's step losses: its mean over the replicas' batches counts the steps before the
  // checkpoint (2 of them) replicas_before times each and the rest replicas times (as ddp's
  // does over its ranks), which the reference's plain mean does not when the two differ.
  struct StepLosses : train::Callback {
    std::vector<double> losses;
    void on_batch_end(train::TrainLoop& loop, int64_t step, double loss) override {
      if (loop.epoch() == 0) losses.push_back(loss);
    }
  };
  auto step_losses = std::make_shared<StepLosses>();
  reference.loop->add_callback(step_losses);
  std::vector<train::EpochResult> expected = reference.loop->fit(2);
  double weighted = 0, weights = 0;
  for (size_t k = 0; k < step_losses->losses.size(); ++k) {
    const int counted = k < 2 ? replicas_before : replicas;
    weighted += counted * step_losses->losses[k], weights += counted;
  }
  expected[0].train_loss = weighted / weights;

  init_process_group(test::worker_backend());
  const int rank = get_rank();
  Job job = make_job(std::make_shared<train::DistributedStrategy>(pipelined(
                         device, replicas,
                         {.micro_batches = micro_batches, .schedule = schedule, .virtual_stages = virtual_stages})),
                     checkpoint, 12 / replicas, false);
  struct StopAtCheckpoint : train::Callback {
    void on_checkpoint(train::TrainLoop& loop) override { loop.request_stop(); }
  };
  if (phase == "first") {
    job.loop->add_callback(std::make_shared<StopAtCheckpoint>());
    job.loop->fit(2);
    std::cout << "rank " << rank << ": stopped at " << job.loop->epoch_samples() << " samples" << std::endl;
    destroy_process_group();
    return job.loop->epoch_samples() == 24 ? 0 : 1;
  }
  job.loop->resume(checkpoint);
  const std::vector<train::EpochResult> got = job.loop->fit(2);
  int failures = 0;
  auto expect_near = [&](double value, double want, const std::string& what) {
    if (std::abs(value - want) <= 1e-10 * (1 + std::abs(want))) return;
    std::cout << std::setprecision(17) << "FAIL: rank " << rank << ": " << what << " is " << value << ", expected "
              << want << std::endl;
    ++failures;
  };
  if (got.size() != 2) std::cout << "FAIL: rank " << rank << ": " << got.size() << " epochs" << std::endl, ++failures;
  for (size_t e = 0; e < got.size() && e < 2; ++e) {
    expect_near(got[e].train_loss, expected[e].train_loss, "epoch " + std::to_string(e + 1) + "'s train loss");
    expect_near(got[e].val->loss, expected[e].val->loss, "epoch " + std::to_string(e + 1) + "'s val loss");
    expect_near(got[e].val->accuracy, expected[e].val->accuracy, "epoch " + std::to_string(e + 1) + "'s val accuracy");
  }
  const auto want = reference.model->state_dict(), have = job.model->state_dict();
  for (size_t i = 0; i < want.size(); ++i)
    expect_near(amax(abs(sub(have[i].second.to(device), want[i].second))).item(), 0, "model." + want[i].first);
  const optim::OptimizerState want_state = reference.optimizer->state_dict(), have_state = job.optimizer->state_dict();
  if (want_state.tensors.size() != have_state.tensors.size()) {
    std::cout << "FAIL: rank " << rank << ": " << have_state.tensors.size() << " optimizer state tensors, expected "
              << want_state.tensors.size() << std::endl;
    ++failures;
  }
  for (const auto& [key, t] : want_state.tensors) {
    const std::string& name = key;  // Clang 14 cannot capture a structured binding
    auto it = std::find_if(have_state.tensors.begin(), have_state.tensors.end(),
                           [&](const auto& e) { return e.first == name; });
    expect_near(it == have_state.tensors.end() ? 1.0 : amax(abs(sub(it->second.to(device), t))).item(), 0,
                "optimizer." + key);
  }
  for (const auto& [key, value] : want_state.scalars) {
    auto it = have_state.scalars.find(key);
    expect_near(it == have_state.scalars.end() ? -1.0 : it->second, value, "optimizer scalar " + key);
  }
  std::cout << "rank " << rank << ": the resumed pipeline loop (" << replicas << " replicas) matches one device ("
            << want.size() << " tensors, " << want_state.tensors.size() << " optimizer state tensors)" << std::endl;
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// broadcast_stages with buffers: a small ResNet (BatchNorm's float running statistics and int64
// counts) trains 2 steps as a pipeline; each rank's copy holds fresh statistics for its own
// stages only, and after broadcast_stages every rank holds the same values of every tensor,
// with every count at 2 micro-batches' worth per step.
int scenario_buffers() {
  init_process_group(test::worker_backend());
  const int rank = get_rank();
  const Device device = test::worker_device();
  Generator weights(11);
  auto model = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &weights);
  pipeline::DistributedPipeline pipe(model->as_sequential(), default_group_ptr(),
                                     {.device = device, .micro_batches = 2});
  for (int s = 0; s < 2; ++s) {
    Generator gen(50 + s);
    Tensor x = randn({6, 1, 12, 12}, DType::Float32, &gen).to(device);
    pipe.step(x, randint(0, 10, {6}, DType::Int64, &gen).to(device), cross_entropy_of);
  }
  int failures = 0;
  auto counts = [&] {
    int64_t low = INT64_MAX;
    for (const auto& [name, t] : model->state_dict())
      if (name.find("num_batches_tracked") != std::string::npos) low = std::min(low, t.to(kCPU).item<int64_t>());
    return low;
  };
  if (counts() != 0)  // the stages of the other ranks have not run here
    std::cout << "FAIL: rank " << rank << ": every stage's statistics were fresh" << std::endl, ++failures;
  pipe.broadcast_stages();
  if (counts() != 4)  // 2 steps of 2 micro-batches, on whichever rank
    std::cout << "FAIL: rank " << rank << ": counts of " << counts() << " after" << std::endl, ++failures;
  for (const auto& [name, t] : model->state_dict())
    if (const double spread = spread_over_ranks(t, device); spread != 0)
      std::cout << "FAIL: rank " << rank << ": " << name << " differs by " << spread << std::endl, ++failures;
  std::cout << "rank " << rank << ": " << model->state_dict().size() << " tensors equal on every rank" << std::endl;
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// balance_by on every rank, each answering differently: every rank must split as rank 0's
// answered, and only rank 0 is asked. Then by_time, whose measurements differ from process to
// process: every rank must still split alike.
int scenario_balance() {
  init_process_group(test::worker_backend());
  const int rank = get_rank(), ranks = get_world_size();
  const Device device = test::worker_device();
  int asked = 0, failures = 0;
  // Rank 0: a layer on each stage but the last; the other ranks: a layer on each but the first.
  pipeline::Balancer by_rank = [&](const nn::Sequential& model, int stages, Device) {
    ++asked;
    std::vector<size_t> balance(static_cast<size_t>(stages), 1);
    balance[rank == 0 ? stages - 1 : 0] = model.size() - static_cast<size_t>(stages) + 1;
    return balance;
  };
  pipeline::DistributedPipeline pipe(test::make_mlp(7), default_group_ptr(),
                                     {.device = device, .balance_by = by_rank, .micro_batches = 2});
  std::vector<size_t> expected(static_cast<size_t>(ranks), 1);
  expected.back() = 7 - static_cast<size_t>(ranks) + 1;
  if (pipe.balance() != expected) std::cout << "FAIL: rank " << rank << " split otherwise" << std::endl, ++failures;
  if (asked != (rank == 0 ? 1 : 0))
    std::cout << "FAIL: rank " << rank << "'s balance_by was asked " << asked << " times" << std::endl, ++failures;
  Generator gen(3);
  pipeline::DistributedPipeline timed(test::make_mlp(7), default_group_ptr(),
                                      {.device = device,
                                       .balance_by = pipeline::by_time(randn({4, 8}, DType::Float64, &gen)),
                                       .micro_batches = 2});
  std::string split;
  for (size_t count : timed.balance()) split += (split.empty() ? "" : "+") + std::to_string(count);
  if (auto difference = first_difference_across_ranks(default_group(), {split}, device))
    std::cout << "FAIL: by_time split the ranks differently: " << *difference << std::endl, ++failures;
  std::cout << "rank " << rank << ": split as rank 0 measured (" << split << " by time)" << std::endl;
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// A TrainLoop of two replicated pipelines of two stages (4 ranks) over a small ResNet: each
// replica's BatchNorm statistics follow its own samples, and the epoch's end gives every rank
// replica 0's (Note [Replicated pipelines in the TrainLoop]). After one epoch every tensor of
// every rank's model is the same, parameters included, and every count is 2 steps of 2
// micro-batches (16 samples, batches of 4 per replica).
int scenario_replica_buffers() {
  const Device device = test::worker_device();
  Generator weights(11), data_gen(12);
  auto model = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &weights);
  model->to(device);
  auto train_set = std::make_shared<data::TensorDataset>(randn({16, 1, 12, 12}, DType::Float32, &data_gen),
                                                         randint(0, 10, {16}, DType::Int64, &data_gen));
  auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.05, 0.9});
  train::TrainLoopOptions options;
  options.strategy = std::make_shared<train::DistributedStrategy>(pipelined(device, 2, {.micro_batches = 2}));
  options.progress = false;
  train::TrainLoop loop(model,
                        std::make_shared<data::DataLoader>(
                            train_set, data::DataLoaderOptions{.batch_size = 4, .shuffle = true, .seed = 3}),
                        nullptr, nullptr, sgd, cross_entropy_of, options);
  const int rank = get_rank();
  loop.fit(1);
  int failures = 0;
  for (const auto& [name, t] : model->state_dict()) {
    if (name.find("num_batches_tracked") != std::string::npos && t.to(kCPU).item<int64_t>() != 4)
      std::cout << "FAIL: rank " << rank << ": " << name << " counts " << t.to(kCPU).item<int64_t>() << std::endl,
          ++failures;
    if (const double spread = spread_over_ranks(t, device); spread != 0)
      std::cout << "FAIL: rank " << rank << ": " << name << " differs by " << spread << std::endl, ++failures;
  }
  std::cout << "rank " << rank << ": replica " << loop.strategy().rank() % 2 << ", " << model->state_dict().size()
            << " tensors equal on every rank" << std::endl;
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Replica 1's ranks (1 and 3) build a model of 12 classes where replica 0's has 10: each
// pipeline agrees within itself, and the replicas of stage 0 agree too, but those of the last
// stage (ranks 2 and 3) do not. Every rank must fail, saying so: the ranks of position 0 too,
// which would otherwise wait for the others in their next collective.
int scenario_replica_mismatch() {
  train::DistributedStrategy strategy(pipelined(test::worker_device(), 2, {.micro_batches = 2}));
  return must_fail("trains replicas that differ",
                   [&] { strategy.prepare(test::make_mlp(7, 16, get_rank() % 2 == 1 ? 12 : 10)); });
}

// Replica 1's ranks ask for 3 micro-batches where replica 0's ask for 2: each pipeline agrees
// within itself, and every rank must still fail naming the field (the replicas' options are
// compared over the whole job).
int scenario_replica_options() {
  train::DistributedStrategy strategy(
      pipelined(test::worker_device(), 2, {.micro_batches = read_launch_env().rank % 2 == 1 ? 3 : 2}));
  return must_fail("trains replicas whose options differ", [&] { strategy.prepare(test::make_mlp(7)); });
}

// reduce() over replicated pipelines where rank 3 counts a sample more than rank 1, the other
// rank of its pipeline (replica 1: ranks 1 and 3): those two fail naming the counts, and
// replica 0's ranks fail too, instead of going on to wait for them.
int scenario_replica_counts() {
  train::DistributedStrategy strategy(pipelined(test::worker_device(), 2, {.micro_batches = 2}));
  strategy.prepare(test::make_mlp(7));
  return must_fail("summed counts that a pipeline's ranks disagree on", [&] {
    strategy.reduce({.loss = 1, .correct = 1, .samples = get_rank() == 3 ? 5.0 : 4.0, .batches = 1});
  });
}

// balance_by over replicated pipelines, answering differently on every rank: every rank must
// split as global rank 0's answered (one measurement for every replica), and only it is asked.
int scenario_replica_balance() {
  int rank = -1, asked = 0;  // the rank is known once the strategy has joined the job
  pipeline::Balancer by_rank = [&](const nn::Sequential& model, int stages, Device) {
    ++asked;
    std::vector<size_t> balance(static_cast<size_t>(stages), 1);
    balance[rank == 0 ? stages - 1 : 0] = model.size() - static_cast<size_t>(stages) + 1;
    return balance;
  };
  train::DistributedStrategy strategy(pipelined(test::worker_device(), 2, {.micro_batches = 2, .balance_by = by_rank}));
  rank = get_rank();
  strategy.prepare(test::make_mlp(7));
  int failures = 0;
  if (strategy.pipeline().balance() != std::vector<size_t>{1, 6})
    std::cout << "FAIL: rank " << rank << " split otherwise" << std::endl, ++failures;
  if (asked != (rank == 0 ? 1 : 0))
    std::cout << "FAIL: rank " << rank << "'s balance_by was asked " << asked << " times" << std::endl, ++failures;
  std::cout << "rank " << rank << ": split 1+6 as rank 0 answered" << std::endl;
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Note [Two dimensions: pipelines replicated over data-parallel groups]: 4 ranks as
// pipeline_mesh(2) lays them out: two pipelines of two ranks (ranks 0, 2 and 1, 3), each stage
// replicated over a data-parallel group (ranks 0, 1 and 2, 3), the pipelines built from the mesh
// (Note [Replicated stages]). Each pipeline trains on its half of every batch; its stages'
// gradients are averaged over their replicas during the step. Equal halves make that the gradient
// of the whole batch's mean loss: every rank's stages must follow the model trained on whole
// batches on one device, and the replicas' losses average to its loss. With buckets of about 100
// bytes each stage has several, and every bucket's all-reduce must be launched inside its stage's
// last backward (the last Backward action's span in the trace), not after the schedule.
int scenario_two_dimensions(const std::string& schedule) {
  init_process_group(test::worker_backend());
  const int rank = get_rank();
  WEFT_CHECK(get_world_size() == 4, "two dimensions: 4 ranks, got ", get_world_size());
  const pipeline::PipelineMesh mesh = pipeline::pipeline_mesh(2);
  int failures = 0;
  if (mesh.replica != rank % 2 || mesh.position != rank / 2 || mesh.pipeline->rank() != rank / 2 ||
      mesh.pipeline->size() != 2 || mesh.replicas_group->rank() != rank % 2 || mesh.replicas_group->size() != 2)
    std::cout << "FAIL: rank " << rank << " is replica " << mesh.replica << " at position " << mesh.position
              << ", pipeline rank " << mesh.pipeline->rank() << ", replica rank " << mesh.replicas_group->rank()
              << std::endl, ++failures;
  const Device device = test::worker_device();
  auto reference = test::make_mlp(7);
  reference->to(device);
  pipeline::DistributedPipeline pipe(test::make_mlp(7), mesh,
                                     {.device = device, .bucket_cap_mb = 1e-4, .first_bucket_mb = 1e-5,
                                      .micro_batches = 2, .schedule = schedule,
                                      .virtual_stages = schedule == "interleaved" ? 2 : 1});
  optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD sgd_pipe(pipe.parameters(), optim::SGDOptions{0.05, 0.9});
  constexpr int kSteps = 10;
  trace::start();
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = batch_of_step(s, 16, device);
    const double expected = reference_step(*reference, sgd_ref, x, y);
    sgd_pipe.zero_grad();
    const pipeline::StepResult result =
        pipe.step(x.narrow(0, 8 * mesh.replica, 8), y.narrow(0, 8 * mesh.replica, 8), cross_entropy_of);
    sgd_pipe.step();
    if (pipe.holds_stage(pipe.num_stages() - 1)) {
      Tensor loss = result.loss.detach().clone();
      mesh.replicas_group->all_reduce(loss, ReduceOp::Avg)->wait();
      failures += loss_differs(rank, s, loss.item(), expected);
    }
  }
  trace::stop();
  failures += count_differing(pipe.named_parameters(), reference->named_parameters(), rank);
  // The buckets' launches, each inside the last backward of some stage of this rank.
  const std::string json = trace::json();
  std::vector<test::TracedSpan> last_backwards, launches;
  for (int st = 0; st < pipe.num_stages(); ++st) {
    if (!pipe.holds_stage(st)) continue;
    std::string last;
    for (const pipeline::Action& a : pipe.schedule().actions[mesh.position])
      if (a.kind == pipeline::ActionKind::Backward && a.stage == st) last = a.str();
    for (const auto& span : test::traced_events(json, last)) last_backwards.push_back(span);
  }
  for (int b = 0;; ++b) {
    const auto found = test::traced_events(json, "bucket " + std::to_string(b) + " ready", /*instants=*/true);
    if (found.empty()) break;
    launches.insert(launches.end(), found.begin(), found.end());
  }
  if (launches.size() < 2 * kSteps)
    std::cout << "FAIL: rank " << rank << " launched " << launches.size() << " buckets in " << kSteps << " steps"
              << std::endl, ++failures;
  auto inside = [](const test::TracedSpan& launch, const test::TracedSpan& b) {
    return b.ts <= launch.ts && launch.ts <= b.ts + b.dur;
  };
  for (const auto& b : last_backwards)
    if (std::none_of(launches.begin(), launches.end(), [&](const auto& launch) { return inside(launch, b); }))
      std::cout << "FAIL: rank " << rank << "'s last backward at " << b.ts << " us launched no bucket" << std::endl,
          ++failures;
  for (const auto& launch : launches)
    if (std::none_of(last_backwards.begin(), last_backwards.end(), [&](const auto& b) { return inside(launch, b); }))
      std::cout << "FAIL: rank " << rank << " launched a bucket at " << launch.ts << " us, outside its stages' last "
                << "backwards" << std::endl, ++failures;
  std::cout << "rank " << rank << ": pipeline rank " << mesh.position << " of replica " << mesh.replica << ", "
            << kSteps << " steps equal one device (" << schedule << "), " << launches.size()
            << " bucket launches inside last backwards" << std::endl;
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// A replicated pipeline (2 x 2) whose last stage holds a trainable parameter that takes no part
// in the forward. Without find_unused_parameters that stage's replicas (ranks 2 and 3) fail their
// first step naming it, and the first stage's finish theirs. With it every rank steps, and the
// parameter keeps no gradient; then every rank freezes a parameter of its stage, and its next
// step fails before any message: the reducers were built for the parameters trainable then.
int scenario_replica_unused(bool find_unused) {
  init_process_group(test::worker_backend());
  const int rank = get_rank();
  const pipeline::PipelineMesh mesh = pipeline::pipeline_mesh(2);
  const Device device = test::worker_device();
  auto model = test::make_mlp(7);
  // A layer whose forward ignores its parameter.
  struct Ignoring : nn::Module {
    Ignoring() : Module("Ignoring") { register_parameter("ignored", ones({3}, TensorOptions(DType::Float64))); }
    Tensor forward(const Tensor& x) override { return x; }
    std::shared_ptr<nn::Module> shallow_copy() const override { return std::make_shared<Ignoring>(*this); }
  };
  model->push_back(std::make_shared<Ignoring>());
  pipeline::DistributedPipeline pipe(model, mesh,
                                     {.device = device, .find_unused_parameters = find_unused, .micro_batches = 2});
  // Named tensors, not structured bindings: Clang 14 cannot capture those in a lambda.
  const std::pair<Tensor, Tensor> batch = batch_of_step(0, 16, device);
  const Tensor& x = batch.first;
  const Tensor& y = batch.second;
  auto step = [&] { pipe.step(x.narrow(0, 8 * mesh.replica, 8), y.narrow(0, 8 * mesh.replica, 8), cross_entropy_of); };
  if (!find_unused) {
    if (mesh.position == 1) return must_fail("stepped with a parameter without a gradient", step);
    step();
    std::cout << "rank " << rank << ": stepped" << std::endl;
    destroy_process_group();
    return 0;
  }
  int failures = 0;
  for (int s = 0; s < 2; ++s) step();
  for (const auto& [name, p] : pipe.named_parameters())
    if (p.grad().defined() == (name == "7.ignored"))
      std::cout << "FAIL: rank " << rank << ": " << name << (p.grad().defined() ? " has" : " has no") << " gradient"
                << std::endl, ++failures;
  std::cout << "rank " << rank << ": stepped" << std::endl;
  pipe.parameters().front().requires_grad_(false);
  return failures + must_fail("stepped with a parameter frozen after construction", step);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string first = argc >= 2 ? argv[1] : "";
  const bool alone = first == "mismatch" || first == "buffers" || first == "balance" || first == "balance-fails" ||
                     first == "two-dimensions" || first == "replica-buffers" || first == "replica-mismatch" ||
                     first == "replica-balance" || first == "replica-counts" || first == "replica-options" ||
                     first == "replica-unused";
  if (argc < 2 || (!alone && argc < 3) || (first == "loop" && argc != 9 && argc != 10)) {
    std::cerr << "usage: pipeline_worker SCHEDULE MICRO_BATCHES [VIRTUAL_STAGES [ACTIVATION_CHECKPOINTING]] | "
                 "pipeline_worker mismatch|buffers|balance|balance-fails|two-dimensions [SCHEDULE]|replica-buffers|"
                 "replica-mismatch|replica-balance|replica-counts|replica-options|replica-unused [find-unused] | "
                 "pipeline_worker loop first|rest sgd|adam SCHEDULE MICRO_BATCHES VIRTUAL_STAGES CHECKPOINT REPLICAS "
                 "[REPLICAS_BEFORE]\n";
    return 2;
  }
  // A scenario's exception is a failure, said on stdout as its checks say theirs.
  auto run = [](const std::function<int()>& scenario) {
    try {
      return scenario();
    } catch (const std::exception& e) {
      std::cout << "FAIL: " << e.what() << std::endl;
      return 1;
    }
  };
  if (first == "buffers") return run(scenario_buffers);
  if (first == "balance") return run(scenario_balance);
  if (first == "two-dimensions") return run([&] { return scenario_two_dimensions(argc >= 3 ? argv[2] : "1f1b"); });
  if (first == "replica-buffers") return run(scenario_replica_buffers);
  if (first == "replica-mismatch") return run(scenario_replica_mismatch);
  if (first == "replica-balance") return run(scenario_replica_balance);
  if (first == "replica-counts") return run(scenario_replica_counts);
  if (first == "replica-options") return run(scenario_replica_options);
  if (first == "replica-unused")
    return run([&] { return scenario_replica_unused(argc >= 3 && std::string(argv[2]) == "find-unused"); });
  if (first == "balance-fails") {
    return run([] {
      init_process_group(test::worker_backend());
      pipeline::Balancer fails = [](const nn::Sequential&, int, Device) -> std::vector<size_t> {
        WEFT_FAIL("no time to measure");
      };
      return must_fail("built a pipeline without a balance", [&] {
        pipeline::DistributedPipeline pipe(test::make_mlp(7), default_group_ptr(),
                                           {.device = test::worker_device(), .balance_by = fails});
      });
    });
  }
  if (first == "loop") {
    return run(
        [&] {
          return scenario_loop(argv[2], argv[3], argv[4], std::atoi(argv[5]), std::atoi(argv[6]), argv[7],
                               std::atoi(argv[8]), argc > 9 ? std::atoi(argv[9]) : std::atoi(argv[8]));
        });
  }
  if (first == "mismatch") {
    return run([] {
      init_process_group(test::worker_backend());
      return must_fail("built a pipeline the other ranks disagree with", [] {
        pipeline::DistributedPipeline pipe(test::make_mlp(7), default_group_ptr(),
                                           {.device = test::worker_device(), .micro_batches = get_rank() == 1 ? 3 : 4});
      });
    });
  }
  const std::string schedule = argv[1];
  const int micro_batches = std::atoi(argv[2]), virtual_stages = argc > 3 ? std::atoi(argv[3]) : 1;
  const std::string activation_checkpointing = argc > 4 ? argv[4] : "never";
  int failures = 0;
  try {
    init_process_group(test::worker_backend());
    const int rank = get_rank();
    const Device device = test::worker_device();
    auto reference = test::make_mlp(7);
    reference->to(device);
    auto whole = test::make_mlp(7);  // this rank's copy of the model, its stages trained by the pipeline
    pipeline::DistributedPipeline pipe(whole, default_group_ptr(),
                                       {.device = device, .micro_batches = micro_batches, .schedule = schedule,
                                        .virtual_stages = virtual_stages,
                                        .activation_checkpointing = activation_checkpointing});
    optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
    optim::SGD sgd_pipe(pipe.parameters(), optim::SGDOptions{0.05, 0.9});
    trace::start();  // to count the forwards that ran again
    for (int s = 0; s < 20; ++s) {
      // The last step's batch is short: fewer samples than micro-batches, one each (interleaved:
      // a multiple of the ranks).
      const bool short_batch = s == 19 && micro_batches > 1;
      const auto [x, y] = batch_of_step(s, short_batch ? micro_batches - 1 : 13, device);
      if (s == 19) trace::stop();  // the recomputations are counted over the 19 whole batches
      const double expected = reference_step(*reference, sgd_ref, x, y);
      sgd_pipe.zero_grad();
      pipeline::StepResult result = pipe.step(x, y, cross_entropy_of);
      sgd_pipe.step();
      if (pipe.holds_stage(pipe.num_stages() - 1)) {
        failures += loss_differs(rank, s, result.loss.item(), expected);
      } else if (result.loss.defined()) {
        std::cout << "FAIL: rank " << rank << " returned a loss without the last stage" << std::endl;
        ++failures;
      }
    }
    // Stage 0's backwards never come right after their forwards: every micro-batch below
    // the mode's bound ran again, on every step.
    if (pipe.holds_stage(0) && virtual_stages == 1) {
      const std::string json = trace::json();
      size_t recomputed = 0;
      for (size_t at = json.find("\"recompute\""); at != std::string::npos; at = json.find("\"recompute\"", at + 1))
        ++recomputed;
      const size_t expected = 19 * static_cast<size_t>(pipeline::recomputed_micro_batches(activation_checkpointing,
                                                                                          micro_batches));
      if (recomputed != expected)
        std::cout << "FAIL: rank " << rank << " recomputed " << recomputed << " forwards, expected " << expected
                  << std::endl, ++failures;
    }
    const auto want = reference->named_parameters();
    const auto got = pipe.named_parameters();
    if (got.empty()) std::cout << "FAIL: rank " << rank << " holds no parameters" << std::endl, ++failures;
    failures += count_differing(got, want, rank);
    // Inference: the last stage's rank gets the reference's output, the others nothing.
    Generator gen(99);
    Tensor x = randn({9, 8}, TensorOptions(DType::Float64), &gen).to(device);
    Tensor out = pipe.forward(x);
    if (pipe.holds_stage(pipe.num_stages() - 1)) {
      const double diff = amax(abs(sub(out, reference->forward(x)))).item();
      if (diff > 1e-10)
        std::cout << "FAIL: rank " << rank << ": forward() differs by " << diff << std::endl, ++failures;
    } else if (out.defined()) {
      std::cout << "FAIL: rank " << rank << ": forward() returned an output without the last stage" << std::endl;
      ++failures;
    }
    // broadcast_stages: every rank's copy becomes the whole trained model (it was not before).
    auto whole_differs = [&] {
      double most = 0;
      const auto mine = whole->named_parameters();
      for (size_t i = 0; i < mine.size(); ++i)
        most = std::max(most, amax(abs(sub(mine[i].second.to(device), want[i].second))).item());
      return most;
    };
    if (whole_differs() < 1e-3)
      std::cout << "FAIL: rank " << rank << ": the copy was trained whole" << std::endl, ++failures;
    pipe.broadcast_stages();
    if (const double diff = whole_differs(); diff > 1e-10) {
      std::cout << "FAIL: rank " << rank << ": after broadcast_stages the model differs by " << diff << std::endl;
      ++failures;
    }
    std::cout << "rank " << rank << ": " << got.size() << " parameters of stages checked after 20 steps ("
              << schedule << ", " << micro_batches << " micro-batches, activation checkpointing "
              << activation_checkpointing << ")" << std::endl;
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "FAIL: " << e.what() << std::endl;
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
