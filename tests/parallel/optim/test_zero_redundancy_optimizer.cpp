// ZeroRedundancyOptimizer: under DDP over 2-4 ranks (processes over loopback, Gloo; the
// scenarios are in tests/parallel/ddp/ddp_worker_zero.cpp) it equals the plain optimizer bit for
// bit, each rank keeping its share of the state; its consolidated state is the plain
// optimizer's. In one process: its errors, and its agreement with the plain optimizer in a
// group of one. (The ddp TrainLoop's checkpoints made with it, resumed on other world sizes,
// are among test_ddp's elastic cases.)
#include "test_util.h"

#include "gloo_suite.h"
#include "parallel/optim/zero_redundancy_optimizer.h"
#include "spawn_ranks.h"

using namespace weft;
using doctest::Contains;
using parallel::ZeroRedundancyOptimizer;

namespace {

const std::string worker = WEFT_DDP_WORKER;

std::vector<Tensor> make_params(uint64_t seed, const std::vector<Shape>& shapes) {
  Generator gen(seed);
  std::vector<Tensor> params;
  for (const Shape& s : shapes) params.push_back(randn(s, TensorOptions(DType::Float64), &gen).requires_grad_());
  return params;
}

parallel::ShardOptimizerFactory adam(double lr) {
  return [lr](std::vector<Tensor> shard) {
    return std::make_shared<optim::Adam>(std::move(shard), optim::AdamOptions{lr});
  };
}

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer under DDP equals the plain optimizer bit for bit, with a share of its state") {
  if (test::skip_without_gloo()) return;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "zero", "mlp", "adam"}, world, std::chrono::seconds(120)));
    test::check_all_ok(test::run_ranks({worker, "zero", "mlp", "sgd"}, world, std::chrono::seconds(120)));
  }
  // nanoGPT's AdamW: each shard's parameters keep their group's weight decay.
  test::check_all_ok(test::run_ranks({worker, "zero", "mlp", "adamw-groups"}, 3, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "zero", "convnet", "adam"}, 2, std::chrono::seconds(180)));
  test::check_all_ok(test::run_ranks({worker, "zero", "gpt", "adamw-groups"}, 2, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "zero", "resnet", "sgd"}, 3, std::chrono::seconds(180)));
  // Two parameters over three ranks: the last owns none and only takes part in the broadcasts.
  auto outcomes = test::run_ranks({worker, "zero", "linear", "adam"}, 3, std::chrono::seconds(120));
  test::check_all_ok(outcomes);
  CHECK_MESSAGE(outcomes[2].output.find("rank 2 owns 0 of 2 parameters") != std::string::npos, outcomes[2].output);
}

TEST_CASE("ZeroRedundancyOptimizer: the consolidated state is the plain optimizer's; loading it resumes exactly") {
  if (test::skip_without_gloo()) return;
  test::check_all_ok(test::run_ranks({worker, "zero_checkpoint", "mlp", "adam"}, 2, std::chrono::seconds(120)));
  test::check_all_ok(test::run_ranks({worker, "zero_checkpoint", "mlp", "sgd"}, 3, std::chrono::seconds(120)));
  test::check_all_ok(
      test::run_ranks({worker, "zero_checkpoint", "mlp", "adamw-groups"}, 2, std::chrono::seconds(120)));
  // Gathered on a rank that owns nothing.
  test::check_all_ok(test::run_ranks({worker, "zero_checkpoint", "linear", "adam"}, 3, std::chrono::seconds(120)));
}

TEST_CASE("ZeroRedundancyOptimizer: different parameter lists fail on every rank, naming the difference") {
  if (test::skip_without_gloo()) return;
  auto outcomes = test::run_ranks({worker, "zero_mismatch"}, 3, std::chrono::seconds(60));
  test::check_all_ok(outcomes);
  for (const auto& o : outcomes)
    CHECK_MESSAGE(o.output.find("ZeroRedundancyOptimizer: the ranks' parameters differ: on rank 0, parameter 5 is "
                                "float64 [10]; on rank 1, there is nothing more") != std::string::npos,
                  o.output);
}

TEST_CASE("ZeroRedundancyOptimizer in a group of one is its shard optimizer, learning-rate changes included") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  const std::vector<Shape> shapes{{3, 4}, {4}, {2, 2}};
  std::vector<Tensor> a = make_params(1, shapes), b = make_params(1, shapes);
  optim::Adam plain(a, optim::AdamOptions{0.1});
  ZeroRedundancyOptimizer zero(b, adam(0.1), group);
  CHECK(zero.name() == "ZeroRedundancyOptimizer(Adam)");
  CHECK(zero.owners() == std::vector<int>{0, 0, 0});
  REQUIRE(zero.shard_optimizer() != nullptr);
  optim::StepLR schedule_plain(plain, 1, 0.5), schedule_zero(zero, 1, 0.5);
  Generator gen(2);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor g = randn(shapes[i], TensorOptions(DType::Float64), &gen);
      a[i].set_grad(g.clone());
      b[i].set_grad(g.clone());
    }
    plain.step();
    zero.step();
    schedule_plain.step();
    schedule_zero.step();
  }
  CHECK(zero.lr() == plain.lr());
  CHECK(zero.shard_optimizer()->lr() == 0.1 / 16);  // the rate of its last step
  for (size_t i = 0; i < shapes.size(); ++i) CHECK(b[i].to_vector<double>() == a[i].to_vector<double>());
  zero.consolidate_state_dict(0);
  const optim::OptimizerState mine = zero.state_dict(), theirs = plain.state_dict();
  CHECK(mine.scalars == theirs.scalars);
  REQUIRE(mine.tensors.size() == theirs.tensors.size());
  for (size_t k = 0; k < mine.tensors.size(); ++k) {
    CHECK(mine.tensors[k].first == theirs.tensors[k].first);
    CHECK(mine.tensors[k].second.to_vector<double>() == theirs.tensors[k].second.to_vector<double>());
  }
}

TEST_CASE("ZeroRedundancyOptimizer over AdamW with weight-decay groups is the grouped AdamW, state included") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  const std::vector<Shape> shapes{{3, 4}, {4}, {2, 2}, {3}};
  std::vector<Tensor> a = make_params(5, shapes), b = make_params(5, shapes);
  auto named = [](const std::vector<Tensor>& params) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < params.size(); ++i) out.emplace_back(std::to_string(i), params[i]);
    return out;
  };
  const std::vector<optim::ParamGroup> groups_a = optim::weight_decay_groups(named(a), 0.1);
  const std::vector<optim::ParamGroup> groups_b = optim::weight_decay_groups(named(b), 0.1);
  optim::AdamW plain(groups_a, optim::AdamWOptions(0.05));
  auto grouped_shard = [groups_b](std::vector<Tensor> shard) {
    return std::make_shared<optim::AdamW>(optim::restrict_groups(groups_b, shard), optim::AdamWOptions(0.05));
  };
  const std::vector<Tensor> order_a = optim::params_of(groups_a), order_b = optim::params_of(groups_b);
  ZeroRedundancyOptimizer zero(order_b, grouped_shard, group);
  Generator gen(6);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < order_a.size(); ++i) {
      Tensor g = randn(order_a[i].shape(), TensorOptions(DType::Float64), &gen);
      Tensor(order_a[i]).set_grad(g.clone());
      Tensor(order_b[i]).set_grad(g.clone());
    }
    plain.step();
    zero.step();
  }
  for (size_t i = 0; i < order_a.size(); ++i) CHECK(order_b[i].to_vector<double>() == order_a[i].to_vector<double>());
  zero.consolidate_state_dict(0);
  const optim::OptimizerState mine = zero.state_dict(), theirs = plain.state_dict();
  CHECK(mine.scalars == theirs.scalars);
  CHECK(mine.scalars.at("3.weight_decay") == 0.0);
  zero.load_state_dict(theirs);
  // A ZeRO over an AdamW without groups refuses the grouped state, naming the parameter.
  const std::vector<Tensor> flat = optim::params_of(optim::weight_decay_groups(named(make_params(5, shapes)), 0.1));
  auto plain_shard = [](std::vector<Tensor> shard) {
    return std::make_shared<optim::AdamW>(std::move(shard), optim::AdamWOptions(0.05));
  };
  ZeroRedundancyOptimizer flat_adamw(flat, plain_shard, group);
  CHECK_THROWS_WITH_AS(flat_adamw.load_state_dict(theirs),
                       Contains("rank 0's shard refused the state: AdamW.load_state_dict: the state gives parameter 0 "
                                "a weight decay of its own"),
                       Error);
}

TEST_CASE("ZeroRedundancyOptimizer: bad parameters, factories and states are errors that say what is wrong") {
  if (test::skip_without_gloo()) return;
  auto group = test::solo_group();
  std::vector<Tensor> params = make_params(3, {{3, 4}, {4}});
  CHECK_THROWS_WITH_AS(ZeroRedundancyOptimizer({}, adam(0.1), group),
                       Contains("ZeroRedundancyOptimizer: got an empty parameter list"), Error);
  CHECK_THROWS_WITH_AS(ZeroRedundancyOptimizer(params, nullptr, group),
                       Contains("ZeroRedundancyOptimizer: the shard optimizer factory is empty"), Error);
  CHECK_THROWS_WITH_AS(
      ZeroRedundancyOptimizer({params[0], zeros({2}, TensorOptions(DType::Float64, Device("cpu:1"))).requires_grad_()},
                              adam(0.1), group),
      Contains("parameter 1 is on cpu:1 but parameter 0 is on cpu:0"), Error);
  CHECK_THROWS_WITH_AS(ZeroRedundancyOptimizer(
                           params, [](std::vector<Tensor>) -> std::shared_ptr<optim::Optimizer> { return nullptr; },
                           group),
                       Contains("the shard optimizer factory returned null"), Error);
  std::vector<Tensor> others = make_params(4, {{3, 4}, {4}});
  auto over_others = [&](std::vector<Tensor>) { return std::make_shared<optim::SGD>(others, optim::SGDOptions{}); };
  CHECK_THROWS_WITH_AS(ZeroRedundancyOptimizer(params, over_others, group),
                       Contains("the factory's SGD optimizes other tensors than the shard it was given"), Error);

  ZeroRedundancyOptimizer zero(params, adam(0.1), group);
  CHECK_THROWS_WITH_AS(zero.state_dict(), Contains("call consolidate_state_dict(0) on every rank first"), Error);
  CHECK_THROWS_WITH_AS(zero.consolidate_state_dict(1), Contains("to 1 is not a rank of this group (0 .. 0)"), Error);

  optim::Adam plain(make_params(3, {{3, 4}, {4}}), optim::AdamOptions{0.1});
  for (Tensor p : plain.params()) p.set_grad(ones_like(p));
  plain.step();
  optim::OptimizerState state = plain.state_dict();
  zero.load_state_dict(state);  // a plain optimizer's state loads
  auto broken = [&](auto change) {
    optim::OptimizerState copy = state;
    change(copy);
    return copy;
  };
  CHECK_THROWS_WITH_AS(zero.load_state_dict(broken([](auto& s) { s.scalars["num_params"] = 3; })),
                       Contains("the state holds 3 parameters but this optimizer has 2"), Error);
  CHECK_THROWS_WITH_AS(zero.load_state_dict(broken([](auto& s) { s.tensors.emplace_back("5.exp_avg", zeros({4})); })),
                       Contains("tensor '5.exp_avg' names parameter 5 but this optimizer has 2 parameters"), Error);
  CHECK_THROWS_WITH_AS(zero.load_state_dict(broken([](auto& s) { s.tensors[0].second = zeros({4, 3}); })),
                       Contains("tensor '0.exp_avg' has shape [4, 3] but parameter 0 has shape [3, 4]"), Error);
  CHECK_THROWS_WITH_AS(zero.load_state_dict(broken([](auto& s) { s.tensors.emplace_back("momentum", zeros({4})); })),
                       Contains("unexpected tensor 'momentum'"), Error);
  optim::SGD sgd(make_params(3, {{3, 4}, {4}}), optim::SGDOptions{0.1});
  CHECK_THROWS_WITH_AS(
      zero.load_state_dict(sgd.state_dict()),
      Contains("rank 0's shard refused the state: Adam.load_state_dict: the state was not saved by Adam"), Error);
}
