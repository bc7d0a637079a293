// nn::Module: registration, traversal, train/eval, device moves, state dicts, clone.
#include "test_util.h"

#include "nn/module.h"

using namespace weft;
using doctest::Contains;

namespace {

struct Affine : nn::Cloneable<Affine> {
  Affine(int64_t in, int64_t out, uint64_t seed) : Cloneable("Affine") {
    register_parameter("weight", test::random({out, in}, DType::Float32, seed));
    register_parameter("bias", zeros({out}));
    register_buffer("calls", zeros({}, DType::Int64));
  }
  Tensor forward(const Tensor& x) override {
    add_(buffer("calls"), 1.0);
    return add(matmul(x, param("weight").t()), param("bias"));
  }
  std::string extra_repr() const override { return "in=" + std::to_string(param("weight").size(1)); }
};

struct Net : nn::Cloneable<Net> {
  Net() : Cloneable("Net") {
    register_module("first", std::make_shared<Affine>(4, 3, 1));
    register_module("second", std::make_shared<Affine>(3, 2, 2));
    register_parameter("scale", ones({1}));
  }
  Tensor forward(const Tensor& x) override { return mul(child("second")(relu(child("first")(x))), param("scale")); }
};

}  // namespace

TEST_CASE("names follow registration order, parents first") {
  Net net;
  std::vector<std::string> names;
  for (auto& [name, t] : net.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"scale", "first.weight", "first.bias", "second.weight", "second.bias"});
  CHECK(net.named_parameters(false).size() == 1);
  CHECK(net.named_buffers().size() == 2);
  CHECK(net.named_buffers()[1].first == "second.calls");
  auto modules = net.named_modules();
  REQUIRE(modules.size() == 3);
  CHECK(modules[1].first == "first");
  CHECK(net.child_as<Affine>("first").type_name() == "Affine");
  for (const Tensor& p : net.parameters()) CHECK(p.requires_grad());
  CHECK(net.repr() == "Net(\n  (first): Affine(in=4)\n  (second): Affine(in=3)\n)");
  CHECK_THROWS_WITH_AS(net.param("missing"), Contains("Net has no parameter 'missing'"), Error);
  CHECK_THROWS_WITH_AS(net.child("third"), Contains("Net has no child module 'third'"), Error);
}

TEST_CASE("registration errors") {
  struct Bad : nn::Cloneable<Bad> {
    explicit Bad(int which) : Cloneable("Bad") {
      register_parameter("w", zeros({1}));
      if (which == 0) register_buffer("w", zeros({1}));
      if (which == 1) register_parameter("a.b", zeros({1}));
      if (which == 2) register_parameter("u", Tensor());
    }
    Tensor forward(const Tensor& x) override { return x; }
  };
  CHECK_THROWS_WITH_AS(Bad(0), Contains("the name 'w' is already registered"), Error);
  CHECK_THROWS_WITH_AS(Bad(1), Contains("invalid name 'a.b'"), Error);
  CHECK_THROWS_WITH_AS(Bad(2), Contains("parameter 'u' is an undefined tensor"), Error);
}

TEST_CASE("train / eval are recursive; zero_grad clears every gradient") {
  Net net;
  net.eval();
  CHECK_FALSE(net.child("first").is_training());
  net.train();
  CHECK(net.child("second").is_training());
  sum(net(test::random({5, 4}, DType::Float32, 3))).backward();
  for (const Tensor& p : net.parameters()) CHECK(p.grad().defined());
  net.zero_grad();
  for (const Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("to(device) keeps parameter identity; to(dtype) converts floating tensors") {
  Net net;
  Tensor held = net.param("scale");  // e.g. an optimizer's handle
  net.to(Device("cpu:1"));
  CHECK(held.device() == Device("cpu:1"));
  CHECK(held.is_same(net.param("scale")));
  for (auto& [name, t] : net.state_dict()) CHECK(t.device() == Device("cpu:1"));
  CHECK(net.device() == Device("cpu:1"));
  Tensor out = net(test::random({2, 4}, DType::Float32, 4).to(Device("cpu:1")));
  sum(out).backward();  // the accumulator follows the leaf to its new device
  CHECK(held.grad().device() == Device("cpu:1"));
  net.to(DType::Float64);
  CHECK(held.dtype() == DType::Float64);
  CHECK(net.child("first").buffer("calls").dtype() == DType::Int64);
}

TEST_CASE("state_dict round trip and load errors") {
  Net a, b;
  for (const Tensor& p : b.parameters()) {
    NoGradGuard no_grad;
    mul_(p, 3.0);
  }
  Tensor x = test::random({3, 4}, DType::Float32, 5);
  b.load_state_dict(a.state_dict());
  CHECK_CLOSE(b(x), a(x), 0, 0);

  nn::NamedTensors state = a.state_dict();
  nn::NamedTensors missing(state.begin() + 1, state.end());
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing), Contains("missing keys: scale"), Error);
  b.load_state_dict(missing, /*strict=*/false);
  nn::NamedTensors extra = state;
  extra.emplace_back("first.gamma", zeros({1}));
  CHECK_THROWS_WITH_AS(b.load_state_dict(extra), Contains("unexpected keys: first.gamma"), Error);
  nn::NamedTensors wrong = state;
  wrong[1].second = zeros({2, 4});
  CHECK_THROWS_WITH_AS(b.load_state_dict(wrong, false),
                       Contains("shape mismatch: first.weight (checkpoint [2, 4], model [3, 4])"), Error);
}

TEST_CASE("clone is deep, independent and equal") {
  Net net;
  net.eval();
  std::shared_ptr<nn::Module> copy = net.clone();
  Tensor x = test::random({3, 4}, DType::Float32, 6);
  CHECK_CLOSE((*copy)(x), net(x), 0, 0);
  CHECK_FALSE(copy->is_training());
  auto original = net.parameters(), cloned = copy->parameters();
  for (size_t i = 0; i < original.size(); ++i) {
    CHECK(cloned[i].storage() != original[i].storage());
    CHECK(cloned[i].is_leaf());
    CHECK(cloned[i].requires_grad());
  }
  {
    NoGradGuard no_grad;
    add_(cloned[1], 1.0);
  }
  CHECK(sum(sub(original[1], cloned[1])).item() != 0.0);
  auto moved = net.clone(Device("cpu:2"));
  CHECK(moved->device() == Device("cpu:2"));
  CHECK(net.device() == kCPU);
}
