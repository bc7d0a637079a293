// One rank of the DistributedDataParallel tests (test_ddp.cpp starts several; the
// SyncBatchNorm and TrainLoop scenarios are in ddp_worker_training.cpp, the
// communication hooks' in ddp_worker_hooks.cpp, ZeroRedundancyOptimizer's in
// ddp_worker_zero.cpp, uneven inputs' in ddp_worker_join.cpp, local SGD's in
// ddp_worker_local_sgd.cpp):
//
//   ddp_worker SCENARIO [ARGS]     (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)
//
// Every rank can compute the single-process reference itself (the data of every step is a
// function of the step, each rank training on its rows of it), so each rank checks its own
// DDP replica against the reference. Prints "FAIL: ..." lines and exits 1 on a failure.
// WEFT_TEST_BACKEND=nccl runs on CUDA ranks (cuda:LOCAL_RANK modulo the devices; the
// reference on the same device); the default is gloo on the CPU.
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <weft.h>

#include "ddp_worker_util.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/process_group/distributed.h"

using namespace weft;
using namespace weft::ddp_worker;
using namespace weft::parallel;

namespace {

// DDP over the world, per-rank batch b, against one process on the whole batch.
int scenario_equivalence(const std::string& model, const std::string& optimizer, bool bucket_view) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
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
  train_side_by_side(*reference, *opt_ref, ddp, *opt_ddp, model, 20, b);
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
    if (scenario == "comm_hook") return scenario_comm_hook(arg1, arg2 == "views");
    if (scenario == "powersgd") return scenario_powersgd(std::stoll(arg1), std::stoll(arg2));
    if (scenario == "sync_bn") return scenario_sync_bn(arg1);
    if (scenario == "sync_bn_uneven") return scenario_sync_bn_uneven();
    if (scenario == "zero") return scenario_zero(arg1, arg2);
    if (scenario == "zero_checkpoint") return scenario_zero_checkpoint(arg1, arg2);
    if (scenario == "zero_mismatch") return scenario_zero_mismatch();
    if (scenario == "join" && argc > 4)
      return scenario_join(arg1, arg2, argv[4], std::vector<std::string>(argv + 5, argv + argc));
    if (scenario == "join_throw") return scenario_join_throw(arg1);
    if (scenario == "local_sgd" && argc > 5)
      return scenario_local_sgd(arg1, std::stoll(arg2), argv[4], argv[5], std::vector<std::string>(argv + 6, argv + argc));
    if (scenario == "elastic" && argc > 4)
      return scenario_elastic(arg1, arg2, argv[4], argc > 5 ? std::stoi(argv[5]) : 0);
    if (scenario == "local_sgd_buffers") return scenario_local_sgd_buffers();
    if (scenario == "elastic_local_sgd" && argc > 4)
      return scenario_elastic_local_sgd(arg1, arg2, argv[4], argc > 5 ? std::stoi(argv[5]) : 0);
  } catch (const std::exception& e) {
    std::cout << "FAIL: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << "ddp_worker: unknown scenario '" << scenario << "'\n";
  return 2;
}
