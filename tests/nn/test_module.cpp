// nn::Module: registration, traversal, train/eval, device moves, state dicts, clone, replica.
#include "test_util.h"

#include <optional>

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

// --- replica ------------------------------------------------------------------------

namespace {

// Each tensor sent to `device` through the differentiable Tensor::to.
std::vector<Tensor> sent_to(const std::vector<Tensor>& tensors, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.to(device));
  return out;
}

}  // namespace

TEST_CASE("replica: parameters sent to cpu:1 by to(); backward reaches the original's grads, bitwise") {
  Generator gen(30);
  nn::MLP model(12, {8, 6}, 4, 0.0, &gen);
  const Device d1("cpu:1");
  Tensor x = test::random({5, 12}, DType::Float32, 31);
  Tensor target = test::random({5, 4}, DType::Float32, 32);
  auto loss_of = [&](nn::Module& m, const Tensor& input) {
    Tensor diff = sub(m(input), target.to(input.device()));
    return sum(mul(diff, diff));
  };
  Tensor expected_loss = loss_of(model, x);
  expected_loss.backward();
  std::vector<Tensor> expected;
  for (const Tensor& p : model.parameters()) expected.push_back(p.grad().clone());
  model.zero_grad();

  std::vector<Tensor> params = sent_to(model.parameters(), d1);
  std::shared_ptr<nn::Module> replica = model.replica(params, {});
  CHECK(replica->type_name() == "MLP");
  CHECK(replica->is_training());
  CHECK(replica->repr() == model.repr());
  std::vector<Tensor> held = replica->parameters();
  REQUIRE(held.size() == params.size());
  for (size_t i = 0; i < held.size(); ++i) {
    CHECK(held[i].is_same(params[i]));  // stored as given: not detached, not a new leaf
    CHECK_FALSE(held[i].is_leaf());
    CHECK(held[i].device() == d1);
  }
  Tensor loss = loss_of(*replica, x.to(d1));
  CHECK(loss.device() == d1);
  CHECK_CLOSE(loss, expected_loss, 0, 0);
  loss.backward();
  std::vector<Tensor> original = model.parameters();
  for (size_t i = 0; i < original.size(); ++i) {
    CAPTURE(i);
    CHECK(original[i].is_leaf());
    REQUIRE(original[i].grad().defined());
    CHECK(original[i].grad().device() == kCPU);
    CHECK_CLOSE(original[i].grad(), expected[i], 0, 0);
  }
}

TEST_CASE("replica: forward equals the original for every nn layer, in training and evaluation") {
  Generator gen(33);
  const Device d1("cpu:1");
  std::vector<std::pair<std::shared_ptr<nn::Module>, Tensor>> cases;
  cases.emplace_back(std::make_shared<nn::ResNet>(1, 5, std::vector<int64_t>{1, 1, 1}, &gen),
                     test::random({2, 1, 8, 8}, DType::Float32, 34));
  cases.emplace_back(std::make_shared<nn::ConvNet>(10, &gen), test::random({2, 1, 28, 28}, DType::Float32, 35));
  cases.emplace_back(
      std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1, 1, 1, true, TensorOptions(), &gen),
          std::make_shared<nn::BatchNorm2d>(3, 1e-5, std::nullopt), std::make_shared<nn::GELU>(),
          std::make_shared<nn::AvgPool2d>(2), std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Dropout>(0.0),
          std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
          std::make_shared<nn::Linear>(3, 2, true, TensorOptions(), &gen)}),
      test::random({3, 2, 8, 8}, DType::Float32, 36));
  // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
  for (const auto& model_input : cases) {
    const std::shared_ptr<nn::Module>& model = model_input.first;
    const Tensor& x = model_input.second;
    CAPTURE(model->type_name());
    for (bool training : {false, true}) {
      CAPTURE(training);
      model->train(training);
      // The reference runs on a deep copy, so that its running stats move as the
      // replica's copies should, and the original's stay put.
      std::shared_ptr<nn::Module> reference = model->clone();
      const nn::NamedTensors before = model->state_dict();
      std::shared_ptr<nn::Module> replica =
          model->replica(sent_to(model->parameters(), d1), sent_to(model->buffers(), d1));
      CHECK(replica->is_training() == training);
      Tensor out = (*replica)(x.to(d1));
      CHECK(out.device() == d1);
      CHECK_CLOSE(out, (*reference)(x), 0, 0);
      const nn::NamedTensors updated = reference->named_buffers(), copies = replica->named_buffers();
      for (size_t i = 0; i < updated.size(); ++i) CHECK_CLOSE(copies[i].second, updated[i].second, 0, 0);
      for (size_t i = 0; i < before.size(); ++i) CHECK_CLOSE(model->state_dict()[i].second, before[i].second, 0, 0);
    }
  }
}

TEST_CASE("replica: gradcheck through a two-device replica, in float64") {
  Generator gen(37);
  nn::Sequential model(std::make_shared<nn::Conv2d>(1, 2, 3, 1, 1, 1, 1, true, DType::Float64, &gen),
                       std::make_shared<nn::BatchNorm2d>(2, 1e-5, 0.1, true, true, DType::Float64),
                       std::make_shared<nn::GELU>(), std::make_shared<nn::MaxPool2d>(2),
                       std::make_shared<nn::Flatten>(),
                       std::make_shared<nn::Linear>(2 * 2 * 2, 3, true, DType::Float64, &gen));
  const Device d1("cpu:1");
  std::vector<Tensor> inputs{test::leaf({2, 1, 4, 4}, 38)};
  for (const Tensor& p : model.parameters()) inputs.push_back(p);
  // f(x, parameters of the original) = the output of a replica built on cpu:1 from them.
  auto fn = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> params = sent_to(std::vector<Tensor>(in.begin() + 1, in.end()), d1);
    std::shared_ptr<nn::Module> replica = model.replica(params, sent_to(model.buffers(), d1));
    return (*replica)(in[0].to(d1));
  };
  CHECK(fn(inputs).device() == d1);
  CHECK_GRADCHECK(fn, inputs);
  model.eval();
  CHECK_GRADCHECK(fn, inputs);
}

TEST_CASE("replica: wrong counts, shapes and dtypes name the parameter or buffer") {
  Net net;
  std::vector<Tensor> params = net.parameters(), buffers = net.buffers();
  CHECK_NOTHROW(net.replica(params, buffers));
  std::vector<Tensor> fewer(params.begin(), params.end() - 1);
  CHECK_THROWS_WITH_AS(net.replica(fewer, buffers),
                       Contains("Net.replica: got 4 parameters but the module has 5 (one per entry of "
                                "named_parameters(), in that order); the first one missing is 'second.bias'"),
                       Error);
  std::vector<Tensor> more = params;
  more.push_back(zeros({1}));
  CHECK_THROWS_WITH_AS(net.replica(more, buffers),
                       Contains("got 6 parameters but the module has 5 (one per entry of named_parameters(), in "
                                "that order); the extra ones start at index 5"),
                       Error);
  CHECK_THROWS_WITH_AS(net.replica(params, {}),
                       Contains("Net.replica: got 0 buffers but the module has 2 (one per entry of named_buffers(), "
                                "in that order); the first one missing is 'first.calls'"),
                       Error);
  std::vector<Tensor> reshaped = params;
  reshaped[3] = zeros({3, 2});
  CHECK_THROWS_WITH_AS(net.replica(reshaped, buffers),
                       Contains("Net.replica: parameter 3 ('second.weight') is float32 [3, 2] but the module's is "
                                "float32 [2, 3]"),
                       Error);
  std::vector<Tensor> converted = params;
  converted[1] = params[1].to(DType::Float64);
  CHECK_THROWS_WITH_AS(net.replica(converted, buffers),
                       Contains("Net.replica: parameter 1 ('first.weight') is float64 [3, 4] but the module's is "
                                "float32 [3, 4]"),
                       Error);
  std::vector<Tensor> float_buffers = {zeros({}), buffers[1]};
  CHECK_THROWS_WITH_AS(net.replica(params, float_buffers),
                       Contains("Net.replica: buffer 0 ('first.calls') is float32 [] but the module's is int64 []"),
                       Error);
  std::vector<Tensor> undefined = params;
  undefined[0] = Tensor();
  CHECK_THROWS_WITH_AS(net.replica(undefined, buffers),
                       Contains("Net.replica: parameter 0 ('scale') is an undefined tensor"), Error);
}

TEST_CASE("replica: a BatchNorm2d replica sharing the original's buffers updates its running stats") {
  for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    CAPTURE(momentum.has_value());
    nn::BatchNorm2d bn(3, 1e-5, momentum);
    {
      NoGradGuard no_grad;
      bn.param("weight").copy_(test::random({3}, DType::Float32, 40));
    }
    std::shared_ptr<nn::Module> reference = bn.clone();
    // Replica 0 of DataParallel: the parameters as they are (on their own device) and
    // the original's buffer tensors themselves.
    std::shared_ptr<nn::Module> replica = bn.replica(bn.parameters(), bn.buffers());
    for (const auto& [name, b] : replica->named_buffers()) CHECK(b.is_same(bn.buffer(name)));
    for (int step = 0; step < 2; ++step) {
      Tensor x = test::random({4, 3, 5, 5}, DType::Float32, 41 + step, -1, 3);
      CHECK_CLOSE((*replica)(x), (*reference)(x), 0, 0);
    }
    CHECK(bn.buffer("num_batches_tracked").item() == 2);
    CHECK(sum(abs(bn.buffer("running_mean"))).item() > 0);
    for (const char* name : {"running_mean", "running_var", "num_batches_tracked"})
      CHECK_CLOSE(bn.buffer(name), reference->buffer(name), 0, 0);
  }
}

namespace {

// The weight of `shared` registered again: Note [Tied parameters].
struct Tied : nn::Cloneable<Tied> {
  Tied() : Cloneable("Tied") {
    auto& shared = register_module("shared", std::make_shared<Affine>(3, 3, 4));
    register_parameter("again", shared.param("weight"));
  }
  Tensor forward(const Tensor& x) override { return matmul(child("shared")(x), param("again")); }
};

}  // namespace

TEST_CASE("a parameter registered twice is listed, saved, cloned, replicated and converted once") {
  Tied tied;
  std::vector<std::string> names;
  for (auto& [name, t] : tied.state_dict()) names.push_back(name);
  // The first name that reaches it: a module's own entries come before its children's.
  CHECK(names == std::vector<std::string>{"again", "shared.bias", "shared.calls"});
  auto same = [](const nn::Module& m) { return m.param("again").is_same(m.child("shared").param("weight")); };
  CHECK(same(tied));
  auto copy = tied.clone();
  CHECK(same(*copy));
  CHECK_FALSE(copy->param("again").is_same(tied.param("again")));
  std::vector<Tensor> params;
  for (const Tensor& p : tied.parameters()) params.push_back(p.detach().clone());
  auto replica = tied.replica(params, tied.buffers());
  CHECK(same(*replica));
  CHECK(replica->param("again").is_same(params[0]));
  tied.to(DType::Float64);
  CHECK(same(tied));
  CHECK(tied.param("again").dtype() == DType::Float64);
  tied.to(Device("cpu:1"));
  CHECK(same(tied));
  CHECK(tied.param("again").device() == Device("cpu:1"));
  // Its gradient sums both uses: d/dW sum((x W^T) W) against the same with two copies of W.
  const Tensor x = test::random({2, 3}, DType::Float64, 5).to(Device("cpu:1"));
  sum(tied(x)).backward();
  const Tensor w = tied.param("again").detach().clone().requires_grad_(), v = w.detach().clone().requires_grad_();
  sum(matmul(add(matmul(x, w.t()), tied.child("shared").param("bias").detach()), v)).backward();
  CHECK_CLOSE(tied.param("again").grad(), add(w.grad(), v.grad()), 1e-12, 0);
  CHECK(tied.parameters().size() == 2);
}
