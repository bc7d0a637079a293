// Parameter groups with their own weight decay (nn/optim/param_group.h): a grouped optimizer
// against one optimizer per group, bit for bit (updates are elementwise, so anything less is a
// grouping bug); nanoGPT's split of a module; the groups in state_dict and the errors of a
// load whose groups differ; restrict_groups as a ZeroRedundancyOptimizer's shards use it.
#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/optim/adam.h"
#include "nn/optim/param_group.h"
#include "nn/optim/sgd.h"
#include "test_util.h"

using namespace weft;
using namespace weft::optim;
using doctest::Contains;

namespace {

std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

bool same_bits(const Tensor& a, const Tensor& b) { return a.dtype() == b.dtype() && values(a) == values(b); }

// A GPT block's kinds of parameter in a scrambled order: matrices, an embedding, biases, gains.
std::vector<Tensor> mixed_params(DType dtype, uint64_t seed) {
  const std::vector<Shape> shapes = {{4, 3}, {4}, {6, 4}, {6}, {4}, {5, 4}, {3}};
  std::vector<Tensor> out;
  for (size_t i = 0; i < shapes.size(); ++i) out.push_back(test::random(shapes[i], dtype, seed + i).requires_grad_());
  return out;
}

std::vector<std::pair<std::string, Tensor>> named(const std::vector<Tensor>& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params.size(); ++i) out.emplace_back("p" + std::to_string(i), params[i]);
  return out;
}

std::vector<Tensor> clones(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Fresh gradients for step k on both copies; parameter 3 skips step 1 (its Adam step count
// then lags the others').
void set_grads(const std::vector<Tensor>& a, const std::vector<Tensor>& b, int k) {
  for (size_t i = 0; i < a.size(); ++i) {
    Tensor g;
    if (!(i == 3 && k == 1)) g = test::random(a[i].shape(), a[i].dtype(), 1000 + 10 * k + i);
    Tensor(a[i]).set_grad(g);
    Tensor(b[i]).set_grad(g.defined() ? g.clone() : Tensor());
  }
}

// One grouped optimizer over `together` against one optimizer per group over copies: after
// each of four steps every parameter has the same bits, and so does every state tensor.
template <class Make>
void check_groups_equal_separate_optimizers(DType dtype, Make make) {
  std::vector<Tensor> together = mixed_params(dtype, 10);
  std::vector<Tensor> apart = clones(together);
  const std::vector<ParamGroup> groups = weight_decay_groups(named(together), 0.1);
  REQUIRE(groups.size() == 2);
  std::vector<Tensor> decay, no_decay;
  std::vector<std::pair<bool, size_t>> where;  // together[i] is (decays ? decay : no_decay)[second]
  for (size_t i = 0; i < together.size(); ++i) {
    const bool decays = together[i].dim() >= 2;
    std::vector<Tensor>& side = decays ? decay : no_decay;
    where.emplace_back(decays, side.size());
    side.push_back(apart[i]);
  }
  auto grouped = make(groups, std::nullopt);
  auto with_decay = make(std::vector<ParamGroup>{{decay, std::nullopt}}, 0.1);
  auto without = make(std::vector<ParamGroup>{{no_decay, std::nullopt}}, 0.0);
  for (int k = 0; k < 4; ++k) {
    CAPTURE(k);
    set_grads(together, apart, k);
    grouped->step();
    with_decay->step();
    without->step();
    for (size_t i = 0; i < together.size(); ++i) {
      CAPTURE(i);
      CHECK(same_bits(together[i], apart[i]));
    }
  }
  // The state: the grouped optimizer numbers the decaying parameters first (params_of).
  std::map<std::string, Tensor> separate;
  for (const auto& entry : with_decay->state_dict().tensors) separate["d" + entry.first] = entry.second;
  for (const auto& entry : without->state_dict().tensors) separate["n" + entry.first] = entry.second;
  const std::vector<Tensor> order = params_of(groups);
  size_t count = 0;
  for (const auto& entry : grouped->state_dict().tensors) {
    const std::string& key = entry.first;
    const size_t dot = key.find('.');
    const Tensor& p = order[std::stoul(key.substr(0, dot))];
    size_t i = 0;
    while (!together[i].is_same(p)) ++i;
    const std::string other = (where[i].first ? "d" : "n") + std::to_string(where[i].second) + key.substr(dot);
    CAPTURE(key);
    REQUIRE(separate.count(other));
    CHECK(same_bits(entry.second, separate.at(other)));
    ++count;
  }
  CHECK(count == separate.size());
}

// The module nanoGPT's rule is for, in small: a Linear, a gain, and a frozen matrix.
struct Tiny : nn::Cloneable<Tiny> {
  Tiny() : Cloneable("Tiny") {
    register_module("fc", std::make_shared<nn::Linear>(4, 3));
    register_parameter("gain", ones({3}));
    register_parameter("frozen", zeros({3, 3}), /*requires_grad=*/false);
  }
  Tensor forward(const Tensor& x) override { return mul(child("fc")(x), param("gain")); }
};

std::vector<Tensor> stepped_grads(const std::vector<Tensor>& params, int k) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back(test::random(params[i].shape(), params[i].dtype(), 77 + 10 * k + i));
  return out;
}

}  // namespace

TEST_CASE("weight_decay_groups: nanoGPT's split of a module, in its order, frozen parameters left out") {
  Tiny tiny;
  const std::vector<ParamGroup> groups = weight_decay_groups(tiny, 0.1);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].weight_decay == 0.1);
  REQUIRE(groups[0].params.size() == 1);
  CHECK(groups[0].params[0].is_same(tiny.child("fc").param("weight")));
  // named_parameters() lists a module's own parameters before its children's.
  CHECK(groups[1].weight_decay == 0.0);
  REQUIRE(groups[1].params.size() == 2);
  CHECK(groups[1].params[0].is_same(tiny.param("gain")));
  CHECK(groups[1].params[1].is_same(tiny.child("fc").param("bias")));
  const std::vector<Tensor> order = params_of(groups);
  REQUIRE(order.size() == 3);
  CHECK(order[1].is_same(tiny.param("gain")));
  // Nothing to leave undecayed: one group.
  nn::Linear no_bias(4, 3, /*bias=*/false);
  const std::vector<ParamGroup> one = weight_decay_groups(no_bias, 0.2);
  REQUIRE(one.size() == 1);
  CHECK(one[0].weight_decay == 0.2);
}

TEST_CASE("AdamW and SGD with weight-decay groups equal one optimizer per group, bit for bit") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    check_groups_equal_separate_optimizers(dtype, [](std::vector<ParamGroup> g, std::optional<double> decay) {
      // The grouped optimizer's own decay (0.3) is what a group without one would use: here none.
      return std::make_unique<AdamW>(std::move(g), AdamWOptions(0.01, {0.9, 0.95}, 1e-8, decay.value_or(0.3)));
    });
    check_groups_equal_separate_optimizers(dtype, [](std::vector<ParamGroup> g, std::optional<double> decay) {
      return std::make_unique<Adam>(std::move(g), AdamOptions{0.01, {0.8, 0.99}, 1e-6, decay.value_or(0.3), true});
    });
    check_groups_equal_separate_optimizers(dtype, [](std::vector<ParamGroup> g, std::optional<double> decay) {
      return std::make_unique<SGD>(std::move(g), SGDOptions{0.05, 0.9, 0.1, decay.value_or(0.3), false, true});
    });
  }
}

TEST_CASE("a group without a weight decay takes the optimizer's, which load_state_dict may change") {
  std::vector<Tensor> a = mixed_params(DType::Float64, 30), b = clones(a);
  // Parameters 0-3 decay by the optimizer's 0.2, 4-6 by their group's 0.
  const AdamWOptions options(0.01, {0.9, 0.99}, 1e-8, 0.2);
  AdamWOptions no_decay = options;
  no_decay.weight_decay = 0;
  AdamW grouped({{{a[0], a[1], a[2], a[3]}, std::nullopt}, {{a[4], a[5], a[6]}, 0.0}}, options);
  AdamW first({b[0], b[1], b[2], b[3]}, options);
  AdamW second({b[4], b[5], b[6]}, no_decay);
  CHECK(!grouped.group_weight_decay(3).has_value());
  CHECK(grouped.group_weight_decay(4) == 0.0);
  for (int k = 0; k < 3; ++k) {
    set_grads(a, b, k);
    grouped.step();
    first.step();
    second.step();
  }
  for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
  const OptimizerState state = grouped.state_dict();
  CHECK(state.scalars.at("weight_decay") == 0.2);
  for (int i = 0; i < 4; ++i) CHECK(!state.scalars.count(std::to_string(i) + ".weight_decay"));
  for (int i = 4; i < 7; ++i) CHECK(state.scalars.at(std::to_string(i) + ".weight_decay") == 0.0);
}

TEST_CASE("state_dict with groups: each group's decay per parameter, and a round trip that continues bit for bit") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    std::vector<Tensor> a = mixed_params(dtype, 50), b = clones(a);
    AdamW straight(weight_decay_groups(named(a), 0.1), AdamWOptions(0.01, {0.9, 0.95}));
    auto resumed = std::make_unique<AdamW>(weight_decay_groups(named(b), 0.1), AdamWOptions(0.01, {0.9, 0.95}));
    for (int k = 0; k < 2; ++k) {
      set_grads(a, b, k);
      straight.step();
      resumed->step();
    }
    OptimizerState saved = resumed->state_dict();
    const std::vector<Tensor> order = params_of(weight_decay_groups(named(b), 0.1));
    for (size_t i = 0; i < order.size(); ++i) {
      CAPTURE(i);
      CHECK(saved.scalars.at(std::to_string(i) + ".weight_decay") == (order[i].dim() >= 2 ? 0.1 : 0.0));
    }
    for (auto& entry : saved.tensors) entry.second = entry.second.clone();
    // Made with other decays: the state's come back, as every hyperparameter does.
    resumed = std::make_unique<AdamW>(weight_decay_groups(named(b), 0.5), AdamWOptions(0.3));
    CHECK(resumed->group_weight_decay(0) == 0.5);
    resumed->load_state_dict(saved);
    CHECK(resumed->group_weight_decay(0) == 0.1);
    CHECK(resumed->group_weight_decay(order.size() - 1) == 0.0);
    CHECK(resumed->state_dict().scalars == saved.scalars);
    for (int k = 2; k < 5; ++k) {
      set_grads(a, b, k);
      straight.step();
      resumed->step();
    }
    for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
  }
}

TEST_CASE("load_state_dict: groups that differ are an error naming the parameter, and change nothing") {
  std::vector<Tensor> a = mixed_params(DType::Float64, 70);
  AdamW grouped(weight_decay_groups(named(a), 0.1), AdamWOptions(0.01));
  set_grads(a, clones(a), 0);
  grouped.step();
  const OptimizerState with_groups = grouped.state_dict();

  std::vector<Tensor> b = mixed_params(DType::Float64, 70);
  AdamW plain(params_of(weight_decay_groups(named(b), 0.1)), AdamWOptions(0.5));
  CHECK_THROWS_WITH_AS(plain.load_state_dict(with_groups),
                       Contains("AdamW.load_state_dict: the state gives parameter 0 a weight decay of its own (scalar "
                                "'0.weight_decay' = 0.1) but here its group sets none"),
                       Error);
  CHECK(plain.lr() == 0.5);
  CHECK(plain.state_dict().tensors.empty());

  AdamW regrouped(weight_decay_groups(named(b), 0.1), AdamWOptions(0.5));
  OptimizerState without = plain.state_dict();
  CHECK_THROWS_WITH_AS(regrouped.load_state_dict(without),
                       Contains("AdamW.load_state_dict: parameter 0's group sets a weight decay (0.1) but the state "
                                "has no scalar '0.weight_decay'"),
                       Error);
  // Only the last parameter's group differs.
  std::vector<ParamGroup> almost = weight_decay_groups(named(b), 0.1);
  Tensor last = almost[1].params.back();
  almost[1].params.pop_back();
  almost.push_back(ParamGroup{{last}, std::nullopt});
  AdamW mostly(almost, AdamWOptions(0.5));
  CHECK_THROWS_WITH_AS(mostly.load_state_dict(with_groups),
                       Contains("the state gives parameter 6 a weight decay of its own (scalar '6.weight_decay' = 0)"),
                       Error);
  CHECK(mostly.lr() == 0.5);
  CHECK(mostly.group_weight_decay(6) == std::nullopt);
  CHECK(mostly.group_weight_decay(5) == 0.0);

  OptimizerState bad = with_groups;
  bad.scalars["3.weight_decay"] = -1;
  CHECK_THROWS_WITH_AS(regrouped.load_state_dict(bad),
                       Contains("scalar '3.weight_decay' (a weight decay) must be >= 0, got -1"), Error);
  bad = with_groups;
  bad.scalars["9.weight_decay"] = 0;
  CHECK_THROWS_WITH_AS(regrouped.load_state_dict(bad),
                       Contains("scalar '9.weight_decay' names parameter 9 but this optimizer has 7 parameters"),
                       Error);
  regrouped.load_state_dict(with_groups);
  CHECK(regrouped.lr() == 0.01);
}

TEST_CASE("parameter groups: construction errors") {
  std::vector<Tensor> p = mixed_params(DType::Float64, 90);
  CHECK_THROWS_WITH_AS(AdamW({{{p[0]}, 0.1}, {{p[1]}, -0.1}}, AdamWOptions()),
                       Contains("AdamW: invalid weight_decay value of parameter group 1: -0.1 (must be >= 0)"), Error);
  CHECK_THROWS_WITH_AS(SGD({{{p[0], p[1]}, 0.1}, {{p[2], p[0]}, 0.0}}, SGDOptions{0.1}),
                       Contains("SGD: parameter 3 is the same tensor as parameter 0"), Error);
  CHECK_THROWS_WITH_AS(Adam({{{}, 0.1}, {{}, std::nullopt}}, AdamOptions{}),
                       Contains("Adam: got an empty parameter list"), Error);
  // An empty group among others is allowed.
  Adam some({{{}, 0.1}, {{p[0]}, std::nullopt}}, AdamOptions{});
  CHECK(some.params().size() == 1);
  CHECK_THROWS_WITH_AS(restrict_groups(weight_decay_groups(named({p[0], p[1]}), 0.1), {p[1], p[2]}),
                       Contains("restrict_groups: tensor 1 of the 2 given is in none of the 2 parameter groups"),
                       Error);
}

TEST_CASE("restrict_groups: shards that keep each parameter's decay step as the whole, state included") {
  // What a ZeroRedundancyOptimizer over params_of(groups) does on two ranks, in one process:
  // each shard optimizer is built over restrict_groups(groups, shard); their states, renamed
  // to the whole's indices, are the whole's.
  std::vector<Tensor> a = mixed_params(DType::Float64, 110), b = clones(a);
  const std::vector<ParamGroup> groups_a = weight_decay_groups(named(a), 0.1);
  const std::vector<ParamGroup> groups_b = weight_decay_groups(named(b), 0.1);
  AdamW whole(groups_a, AdamWOptions(0.01));
  const std::vector<Tensor> order = params_of(groups_b);
  std::vector<size_t> owned[2];  // indices into `order`, uneven and interleaved across the groups
  for (size_t i = 0; i < order.size(); ++i) owned[i % 3 == 0 ? 0 : 1].push_back(i);
  std::vector<std::unique_ptr<AdamW>> shards;
  for (int r = 0; r < 2; ++r) {
    std::vector<Tensor> shard;
    for (size_t i : owned[r]) shard.push_back(order[i]);
    std::vector<ParamGroup> restricted = restrict_groups(groups_b, shard);
    const std::vector<Tensor> kept = params_of(restricted);
    REQUIRE(kept.size() == shard.size());
    for (size_t k = 0; k < shard.size(); ++k) CHECK(kept[k].is_same(shard[k]));
    shards.push_back(std::make_unique<AdamW>(std::move(restricted), AdamWOptions(0.01)));
  }
  CHECK(shards[0]->params().size() == 3);
  const std::vector<Tensor> order_a = params_of(groups_a);
  for (int k = 0; k < 3; ++k) {
    const std::vector<Tensor> grads = stepped_grads(order_a, k);
    for (size_t i = 0; i < order.size(); ++i) {
      Tensor(order_a[i]).set_grad(grads[i]);
      Tensor(order[i]).set_grad(grads[i].clone());
    }
    whole.step();
    for (auto& shard : shards) shard->step();
  }
  for (size_t i = 0; i < order.size(); ++i) CHECK(same_bits(order_a[i], order[i]));
  OptimizerState gathered;
  for (int r = 0; r < 2; ++r) {
    const OptimizerState mine = shards[r]->state_dict();
    for (const auto& [key, t] : mine.tensors) {
      const size_t dot = key.find('.');
      gathered.tensors.emplace_back(std::to_string(owned[r][std::stoul(key.substr(0, dot))]) + key.substr(dot), t);
    }
    for (const auto& [key, value] : mine.scalars) {
      const size_t dot = key.find('.');
      const bool indexed = dot != std::string::npos && std::isdigit(static_cast<unsigned char>(key[0]));
      gathered.scalars[indexed ? std::to_string(owned[r][std::stoul(key.substr(0, dot))]) + key.substr(dot) : key] =
          value;
    }
  }
  gathered.scalars["num_params"] = static_cast<double>(order.size());
  const OptimizerState expected = whole.state_dict();
  CHECK(gathered.scalars == expected.scalars);
  std::map<std::string, Tensor> by_name(gathered.tensors.begin(), gathered.tensors.end());
  REQUIRE(by_name.size() == expected.tensors.size());
  for (const auto& entry : expected.tensors) {
    CAPTURE(entry.first);
    REQUIRE(by_name.count(entry.first));
    CHECK(same_bits(by_name.at(entry.first), entry.second));
  }
}
