// weft::nn models (ConvNet, MLP, ResNet): parameter names and shapes equal to the PyTorch
// modules they mirror, seeded initialisation, clone / to / state_dict on whole models,
// an end-to-end gradcheck and a few training steps that must lower the loss.
#include <memory>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/models/convnet.h"
#include "nn/models/mlp.h"
#include "nn/models/resnet.h"
#include "nn/pooling.h"
#include "nn/sequential.h"
#include "test_util.h"

using namespace weft;
using doctest::Contains;

namespace {

using Expected = std::vector<std::pair<std::string, Shape>>;

Expected names_and_shapes(const nn::NamedTensors& tensors) {
  Expected out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.shape());
  return out;
}

bool equal_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.detach().to_vector<double>() == b.detach().to_vector<double>();
}

Tensor find(const nn::NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  FAIL("no tensor named ", name);
  return Tensor();
}

bool same_state(const nn::Module& a, const nn::Module& b) {
  auto sa = a.state_dict(), sb = b.state_dict();
  if (sa.size() != sb.size()) return false;
  for (size_t i = 0; i < sa.size(); ++i)
    if (sa[i].first != sb[i].first || !equal_values(sa[i].second, sb[i].second)) return false;
  return true;
}

// A fixed batch of images with class labels.
std::pair<Tensor, Tensor> batch(int64_t n, const Shape& image, uint64_t seed, int64_t classes = 10) {
  Shape shape = image;
  shape.insert(0, n);
  Generator gen(seed);
  return {rand(shape, {}, &gen), randint(0, classes, {n}, DType::Int64, &gen)};
}

}  // namespace

// --- names and shapes, as PyTorch's state_dict has them -----------------------------

TEST_CASE("ConvNet: PyTorch's parameter names and shapes, printing, output shape") {
  nn::ConvNet model;
  CHECK(names_and_shapes(model.named_parameters()) == Expected{{"layer1.0.weight", {16, 1, 5, 5}},
                                                               {"layer1.0.bias", {16}},
                                                               {"layer2.0.weight", {32, 16, 5, 5}},
                                                               {"layer2.0.bias", {32}},
                                                               {"fc.weight", {10, 1568}},
                                                               {"fc.bias", {10}}});
  CHECK(model.named_buffers().empty());
  CHECK(model.repr() ==
        "ConvNet(\n"
        "  (layer1): Sequential(\n"
        "    (0): Conv2d(1, 16, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))\n"
        "    (1): ReLU()\n"
        "    (2): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=false)\n"
        "  )\n"
        "  (layer2): Sequential(\n"
        "    (0): Conv2d(16, 32, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))\n"
        "    (1): ReLU()\n"
        "    (2): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=false)\n"
        "  )\n"
        "  (fc): Linear(in_features=1568, out_features=10, bias=true)\n"
        ")");
  auto [x, y] = batch(3, {1, 28, 28}, 1);
  CHECK(model(x).shape() == Shape{3, 10});
  CHECK(nn::ConvNet(7)(x).shape() == Shape{3, 7});
  CHECK_THROWS_WITH_AS(model(rand({3, 1, 32, 32})), Contains("ConvNet: expected images of shape [N, 1, 28, 28]"),
                       Error);
}

TEST_CASE("ConvNet: forward is the layers' functional ops") {
  Generator gen(2);
  nn::ConvNet model(10, &gen);
  auto [x, y] = batch(2, {1, 28, 28}, 3);
  auto p = [&](const std::string& name) { return find(model.named_parameters(), name); };
  Tensor h = max_pool2d(relu(conv2d(x, p("layer1.0.weight"), p("layer1.0.bias"), {1, 1}, {2, 2})), {2, 2});
  h = max_pool2d(relu(conv2d(h, p("layer2.0.weight"), p("layer2.0.bias"), {1, 1}, {2, 2})), {2, 2});
  CHECK_CLOSE(model(x), linear(h.reshape({2, 1568}), p("fc.weight"), p("fc.bias")), 1e-6, 1e-5);
}

TEST_CASE("MLP: names and shapes, flattening, dropout") {
  nn::MLP model;
  CHECK(names_and_shapes(model.named_parameters()) == Expected{{"layers.0.weight", {256, 784}},
                                                               {"layers.0.bias", {256}},
                                                               {"layers.3.weight", {128, 256}},
                                                               {"layers.3.bias", {128}},
                                                               {"layers.6.weight", {10, 128}},
                                                               {"layers.6.bias", {10}}});
  auto [x, y] = batch(4, {1, 28, 28}, 4);
  CHECK(model(x).shape() == Shape{4, 10});
  nn::MLP small(12, {5}, 3, 0.5);
  CHECK(names_and_shapes(small.named_parameters()) ==
        Expected{{"layers.0.weight", {5, 12}}, {"layers.0.bias", {5}}, {"layers.3.weight", {3, 5}}, {"layers.3.bias", {3}}});
  Tensor z = rand({2, 3, 4});
  small.eval();
  Tensor expected = linear(relu(linear(z.reshape({2, 12}), small.named_parameters()[0].second,
                                       small.named_parameters()[1].second)),
                           small.named_parameters()[2].second, small.named_parameters()[3].second);
  CHECK_CLOSE(small(z), expected, 1e-6, 1e-6);
  CHECK_THROWS_WITH_AS(small(rand({2, 13})), Contains("MLP: expected 12 features per sample"), Error);
}

TEST_CASE("ResNet: torchvision's names and shapes, buffers, inputs of 1x28x28 and 3x32x32") {
  nn::ResNet model(1, 10, {1, 1, 1});
  CHECK(names_and_shapes(model.named_parameters()) == Expected{
                                                          {"conv1.weight", {16, 1, 3, 3}},
                                                          {"bn1.weight", {16}},
                                                          {"bn1.bias", {16}},
                                                          {"layer1.0.conv1.weight", {16, 16, 3, 3}},
                                                          {"layer1.0.bn1.weight", {16}},
                                                          {"layer1.0.bn1.bias", {16}},
                                                          {"layer1.0.conv2.weight", {16, 16, 3, 3}},
                                                          {"layer1.0.bn2.weight", {16}},
                                                          {"layer1.0.bn2.bias", {16}},
                                                          {"layer2.0.conv1.weight", {32, 16, 3, 3}},
                                                          {"layer2.0.bn1.weight", {32}},
                                                          {"layer2.0.bn1.bias", {32}},
                                                          {"layer2.0.conv2.weight", {32, 32, 3, 3}},
                                                          {"layer2.0.bn2.weight", {32}},
                                                          {"layer2.0.bn2.bias", {32}},
                                                          {"layer2.0.downsample.0.weight", {32, 16, 1, 1}},
                                                          {"layer2.0.downsample.1.weight", {32}},
                                                          {"layer2.0.downsample.1.bias", {32}},
                                                          {"layer3.0.conv1.weight", {64, 32, 3, 3}},
                                                          {"layer3.0.bn1.weight", {64}},
                                                          {"layer3.0.bn1.bias", {64}},
                                                          {"layer3.0.conv2.weight", {64, 64, 3, 3}},
                                                          {"layer3.0.bn2.weight", {64}},
                                                          {"layer3.0.bn2.bias", {64}},
                                                          {"layer3.0.downsample.0.weight", {64, 32, 1, 1}},
                                                          {"layer3.0.downsample.1.weight", {64}},
                                                          {"layer3.0.downsample.1.bias", {64}},
                                                          {"fc.weight", {10, 64}},
                                                          {"fc.bias", {10}},
                                                      });
  auto buffers = names_and_shapes(model.named_buffers());
  REQUIRE(buffers.size() == 3 * 9);  // 9 batch norms, 3 buffers each
  CHECK(buffers[0] == std::pair<std::string, Shape>{"bn1.running_mean", {16}});
  CHECK(buffers[2] == std::pair<std::string, Shape>{"bn1.num_batches_tracked", {}});
  CHECK(buffers[16] == std::pair<std::string, Shape>{"layer2.0.downsample.1.running_var", {32}});

  nn::ResNet deep;  // {2, 2, 2}: the second block of each stage has no downsample
  auto names = deep.named_parameters();
  CHECK(names.size() == 3 + 3 * 2 * 6 + 2 * 3 + 2);
  CHECK(deep.child("layer2").named_children().size() == 2);
  CHECK(deep.named_parameters()[24].first == "layer2.1.conv1.weight");
  CHECK(deep.named_parameters()[24].second.shape() == Shape{32, 32, 3, 3});

  auto [x, y] = batch(2, {1, 28, 28}, 5);
  CHECK(model(x).shape() == Shape{2, 10});
  nn::ResNet cifar(3, 100, {1, 1, 1});
  auto [c, t] = batch(2, {3, 32, 32}, 6);
  CHECK(cifar(c).shape() == Shape{2, 100});
}

TEST_CASE("ResNet: BasicBlock forward by hand; batch norm follows train / eval") {
  Generator gen(7);
  nn::BasicBlock block(3, 4, 2, &gen);
  CHECK(block.named_children().back().first == "downsample");
  nn::BasicBlock same(4, 4, 1, &gen);
  CHECK(same.named_children().back().first == "bn2");  // identity shortcut
  Tensor x = test::random({2, 3, 6, 6}, DType::Float32, 8);
  auto p = [&](const std::string& name) { return find(block.named_parameters(), name); };
  auto bn = [&](const Tensor& in, const std::string& name) {
    return batch_norm(in, Tensor(), Tensor(), p(name + ".weight"), p(name + ".bias"), true);
  };
  Tensor out = relu(bn(conv2d(x, p("conv1.weight"), Tensor(), {2, 2}, {1, 1}), "bn1"));
  out = bn(conv2d(out, p("conv2.weight"), Tensor(), {1, 1}, {1, 1}), "bn2");
  Tensor shortcut = bn(conv2d(x, p("downsample.0.weight"), Tensor(), {2, 2}), "downsample.1");
  CHECK_CLOSE(block(x), relu(add(out, shortcut)), 1e-5, 1e-5);

  // He-normal convolutions (fan_out, relu): std sqrt(2 / (out * k * k)).
  nn::ResNet model(1, 10, {1, 1, 1}, &gen);
  Tensor w = find(model.named_parameters(), "layer3.0.conv2.weight");
  auto v = w.to_vector<double>();
  double sq = 0;
  for (double e : v) sq += e * e;
  CHECK(std::sqrt(sq / double(v.size())) == doctest::Approx(std::sqrt(2.0 / (64 * 9))).epsilon(0.05));

  auto [images, labels] = batch(4, {1, 28, 28}, 9);
  Tensor train_out = model(images);
  CHECK(find(model.named_buffers(), "layer1.0.bn1.num_batches_tracked").item() == 1);
  model.eval();
  CHECK_FALSE(model.child_as<nn::Sequential>("layer2")[0].is_training());
  Tensor eval_out = model(images);
  CHECK(find(model.named_buffers(), "layer1.0.bn1.num_batches_tracked").item() == 1);
  CHECK(test::mismatch(train_out, eval_out, 1e-4, 1e-4) != "");  // running stats, not batch stats
  CHECK_CLOSE(model(images), eval_out, 0, 0);                     // and deterministic
}

// --- seeds, copies, devices, checkpoints -------------------------------------------

TEST_CASE("models: the same seed gives the same initial weights") {
  Generator a(42), b(42), c(43);
  nn::ConvNet m1(10, &a), m2(10, &b), m3(10, &c);
  CHECK(same_state(m1, m2));
  CHECK_FALSE(same_state(m1, m3));
  Generator d(5), e(5);
  CHECK(same_state(nn::ResNet(3, 10, {1, 1, 1}, &d), nn::ResNet(3, 10, {1, 1, 1}, &e)));
  Generator f(6), g(6);
  CHECK(same_state(nn::MLP(20, {8}, 3, 0.0, &f), nn::MLP(20, {8}, 3, 0.0, &g)));
  // Without a generator, manual_seed fixes the default one.
  manual_seed(3);
  nn::ConvNet m4;
  manual_seed(3);
  nn::ConvNet m5;
  CHECK(same_state(m4, m5));
}

TEST_CASE("models: clone() gives equal outputs and independent parameters and buffers") {
  Generator gen(10);
  nn::ResNet model(1, 10, {1, 1, 1}, &gen);
  auto [x, y] = batch(3, {1, 28, 28}, 11);
  model(x);  // running stats away from their initial values
  model.eval();
  std::shared_ptr<nn::Module> copy = model.clone();
  CHECK(copy->type_name() == "ResNet");
  CHECK_FALSE(copy->is_training());
  CHECK(dynamic_cast<nn::ResNet*>(copy.get()) != nullptr);
  CHECK(same_state(model, *copy));
  CHECK_CLOSE((*copy)(x), model(x), 0, 0);

  auto params = model.named_parameters(), copied = copy->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK_FALSE(params[i].second.storage().get() == copied[i].second.storage().get());
    CHECK(copied[i].second.requires_grad());
    CHECK(copied[i].second.is_leaf());
  }
  {
    NoGradGuard no_grad;
    fill_(find(copy->named_parameters(), "fc.bias"), 5.0);
    fill_(find(copy->named_buffers(), "bn1.running_mean"), 1.0);
  }
  CHECK_FALSE(same_state(model, *copy));
  CHECK(test::mismatch(find(model.named_parameters(), "fc.bias"), full({10}, 5.0), 0, 0) != "");
  CHECK(test::mismatch(find(model.named_buffers(), "bn1.running_mean"), ones({16}), 0, 0) != "");

  // Gradients of the copy land on the copy's parameters only.
  sum((*copy)(x)).backward();
  CHECK(find(copy->named_parameters(), "fc.weight").grad().defined());
  CHECK_FALSE(find(model.named_parameters(), "fc.weight").grad().defined());
}

TEST_CASE("models: to(cpu:1) moves every parameter and buffer; outputs are unchanged") {
  Generator gen(12);
  nn::ResNet model(1, 10, {1, 1, 1}, &gen);
  model.eval();
  auto [x, y] = batch(2, {1, 28, 28}, 13);
  Tensor before = model(x);
  Tensor weight = find(model.named_parameters(), "fc.weight");
  model.to(Device("cpu:1"));
  // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
  for (const auto& named : model.state_dict()) {
    const std::string& name = named.first;
    const Tensor& t = named.second;
    CAPTURE(name);
    CHECK(t.device() == Device("cpu:1"));
  }
  CHECK(weight.device() == Device("cpu:1"));  // the same parameter handle, moved
  CHECK(model.device() == Device("cpu:1"));
  Tensor after = model(x.to(Device("cpu:1")));
  CHECK(after.device() == Device("cpu:1"));
  CHECK_CLOSE(after, before, 0, 0);
  CHECK_THROWS_AS(model(x), Error);  // input left on cpu:0

  nn::ConvNet convnet;
  std::shared_ptr<nn::Module> there = convnet.clone(Device("cpu:1"));
  for (const auto& [name, t] : there->state_dict()) CHECK(t.device() == Device("cpu:1"));
  for (const auto& [name, t] : convnet.state_dict()) CHECK(t.device() == Device("cpu:0"));
}

TEST_CASE("models: state_dict / load_state_dict round trip and its errors") {
  Generator a(14), b(15);
  nn::ResNet source(1, 10, {1, 1, 1}, &a), target(1, 10, {1, 1, 1}, &b);
  auto [x, y] = batch(3, {1, 28, 28}, 16);
  source(x);
  source.eval();
  target.eval();
  CHECK_FALSE(same_state(source, target));
  nn::NamedTensors state = source.state_dict();
  CHECK(state.size() == 29 + 27);
  CHECK(find(state, "layer1.0.bn1.num_batches_tracked").dtype() == DType::Int64);
  target.load_state_dict(state);
  CHECK(same_state(source, target));
  CHECK_CLOSE(target(x), source(x), 0, 0);
  CHECK(find(target.named_buffers(), "bn1.num_batches_tracked").item() == 1);

  nn::ConvNet convnet;
  nn::NamedTensors good = convnet.state_dict();
  nn::NamedTensors missing(good.begin(), good.end() - 1);
  CHECK_THROWS_WITH_AS(convnet.load_state_dict(missing), Contains("missing keys: fc.bias"), Error);
  CHECK_NOTHROW(convnet.load_state_dict(missing, /*strict=*/false));
  nn::NamedTensors unexpected = good;
  unexpected.emplace_back("fc.extra", zeros({2}));
  CHECK_THROWS_WITH_AS(convnet.load_state_dict(unexpected), Contains("unexpected keys: fc.extra"), Error);
  CHECK_NOTHROW(convnet.load_state_dict(unexpected, false));
  nn::NamedTensors misshaped = good;
  misshaped[4].second = zeros({10, 1567});
  CHECK_THROWS_WITH_AS(convnet.load_state_dict(misshaped),
                       Contains("shape mismatch: fc.weight (checkpoint [10, 1567], model [10, 1568])"), Error);
  CHECK_THROWS_WITH_AS(convnet.load_state_dict(misshaped, false), Contains("shape mismatch: fc.weight"), Error);
  // A failed load changes nothing.
  nn::ConvNet fresh;
  nn::NamedTensors before = fresh.state_dict();
  std::vector<Tensor> snapshot;
  for (auto& [name, t] : before) snapshot.push_back(t.clone());
  CHECK_THROWS_AS(fresh.load_state_dict(misshaped), Error);
  auto after = fresh.state_dict();
  for (size_t i = 0; i < after.size(); ++i) CHECK(equal_values(after[i].second, snapshot[i]));
}

// --- training ------------------------------------------------------------------------

TEST_CASE("gradcheck: a small model end to end, through the loss, in float64") {
  Generator gen(17);
  nn::Sequential model(std::make_shared<nn::Conv2d>(1, 2, 3, 1, 1, 1, 1, true, DType::Float64, &gen),
                       std::make_shared<nn::BatchNorm2d>(2, 1e-5, 0.1, true, true, DType::Float64),
                       std::make_shared<nn::GELU>(), std::make_shared<nn::MaxPool2d>(2),
                       std::make_shared<nn::Flatten>(),
                       std::make_shared<nn::Linear>(2 * 2 * 2, 3, true, DType::Float64, &gen));
  Tensor x = test::leaf({2, 1, 4, 4}, 18);
  Tensor target = tensor(std::vector<int64_t>{2, 0});
  nn::CrossEntropyLoss criterion({.label_smoothing = 0.1});
  std::vector<Tensor> inputs{x};
  for (const Tensor& p : model.parameters()) inputs.push_back(p);
  CHECK(inputs.size() == 1 + 6);
  auto logits = [&](const std::vector<Tensor>& in) { return model(in[0]); };
  auto loss = [&](const std::vector<Tensor>& in) { return criterion(model(in[0]), target); };
  CHECK_GRADCHECK(logits, inputs);
  CHECK_GRADCHECK(loss, inputs);

  nn::BasicBlock block(2, 3, 2, &gen);
  block.to(DType::Float64);
  Tensor bx = test::leaf({2, 2, 4, 4}, 19);
  std::vector<Tensor> block_inputs{bx};
  for (const Tensor& p : block.parameters()) block_inputs.push_back(p);
  auto block_fn = [&](const std::vector<Tensor>& in) { return block(in[0]); };
  CHECK_GRADCHECK(block_fn, block_inputs);
}

TEST_CASE("ConvNet: a few SGD steps on a fixed batch lower the loss") {
  Generator gen(20);
  nn::ConvNet model(10, &gen);
  auto [x, y] = batch(16, {1, 28, 28}, 21);
  nn::CrossEntropyLoss criterion;
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    model.zero_grad();
    Tensor loss = criterion(model(x), y);
    losses.push_back(loss.item());
    loss.backward();
    NoGradGuard no_grad;
    for (const Tensor& p : model.parameters()) {
      REQUIRE(p.grad().defined());
      sub_(p, mul(p.grad(), 0.05));
    }
  }
  std::string trace;
  for (double l : losses) trace += std::to_string(l) + " ";
  CAPTURE(trace);
  for (size_t i = 1; i < losses.size(); ++i) CHECK(losses[i] < losses[i - 1]);
  CHECK(losses.back() < 0.95 * losses.front());
}
