// weft::nn layers, initialisers and loss modules: every layer's forward against the
// functional op with the layer's own parameters, PyTorch's parameter names, shapes and
// default initialisation statistics, printing, BatchNorm2d's running statistics and
// Dropout's modes.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/pooling.h"
#include "nn/sequential.h"
#include "test_util.h"

using namespace weft;
using doctest::Contains;

namespace {

struct Stats {
  double mean = 0, std = 0, min = 0, max = 0;
};

// Sample mean, (biased) std and range of a tensor's values, in float64.
Stats stats_of(const Tensor& t) {
  auto v = t.detach().to_vector<double>();
  Stats s;
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / double(v.size()));
  return s;
}

// (name, shape) of each entry, in order.
std::vector<std::pair<std::string, Shape>> names_and_shapes(const nn::NamedTensors& tensors) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.shape());
  return out;
}

using Expected = std::vector<std::pair<std::string, Shape>>;

bool equal_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.detach().to_vector<double>() == b.detach().to_vector<double>();
}

}  // namespace

// --- init ----------------------------------------------------------------------------

TEST_CASE("init: calculate_fan_in_and_fan_out and calculate_gain") {
  CHECK(nn::init::calculate_fan_in_and_fan_out(empty({16, 1, 5, 5})) == std::pair<int64_t, int64_t>{25, 400});
  CHECK(nn::init::calculate_fan_in_and_fan_out(empty({10, 1568})) == std::pair<int64_t, int64_t>{1568, 10});
  CHECK(nn::init::calculate_fan_in_and_fan_out(empty({3, 4, 2, 3, 5})) == std::pair<int64_t, int64_t>{120, 90});
  CHECK_THROWS_WITH_AS(nn::init::calculate_fan_in_and_fan_out(empty({7})), Contains("at least 2 dims, got shape [7]"),
                       Error);
  using nn::init::Nonlinearity;
  CHECK(nn::init::calculate_gain(Nonlinearity::Relu) == doctest::Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain(Nonlinearity::Tanh) == doctest::Approx(5.0 / 3.0));
  CHECK(nn::init::calculate_gain(Nonlinearity::Linear) == 1.0);
  CHECK(nn::init::calculate_gain(Nonlinearity::LeakyRelu, std::sqrt(5.0)) == doctest::Approx(std::sqrt(1.0 / 3.0)));
  CHECK(nn::init::calculate_gain(Nonlinearity::LeakyRelu) == doctest::Approx(std::sqrt(2.0 / 1.0001)));
}

TEST_CASE("init: uniform_ and normal_ statistics, in place, on a parameter") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    Generator gen(11);
    Tensor u = empty({200, 500}, dtype).requires_grad_();
    const Tensor& same = nn::init::uniform_(u, -2.0, 3.0, &gen);
    CHECK(same.is_same(u));
    CHECK(u.is_leaf());
    CHECK(u.requires_grad());
    Stats su = stats_of(u);
    CHECK(su.min >= -2.0);
    CHECK(su.max < 3.0);
    CHECK(su.min < -1.99);
    CHECK(su.max > 2.99);
    CHECK(su.mean == doctest::Approx(0.5).epsilon(0.02));
    CHECK(su.std == doctest::Approx(5.0 / std::sqrt(12.0)).epsilon(0.01));

    Tensor n = empty({200, 500}, dtype);
    nn::init::normal_(n, 1.5, 0.25, &gen);
    Stats sn = stats_of(n);
    CHECK(std::fabs(sn.mean - 1.5) < 0.005);
    CHECK(sn.std == doctest::Approx(0.25).epsilon(0.01));
  }
}

TEST_CASE("init: a non-contiguous view is filled in place") {
  Tensor base = zeros({6, 8}, DType::Float64);
  Tensor view = base.transpose(0, 1).slice(0, 0, 8, 2);  // [4, 6], strided
  Generator gen(5);
  nn::init::uniform_(view, 1.0, 2.0, &gen);
  auto v = base.to_vector<double>();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 8; ++c) {
      double x = v[r * 8 + c];
      if (c % 2 == 0) {
        CHECK((x >= 1.0 && x < 2.0));
      } else {
        CHECK(x == 0.0);
      }
    }
}

TEST_CASE("init: constant_, zeros_, ones_") {
  Tensor t = test::random({3, 4}, DType::Float32, 3).requires_grad_();
  nn::init::constant_(t, 0.75);
  CHECK(stats_of(t).min == 0.75);
  CHECK(stats_of(t).max == 0.75);
  nn::init::zeros_(t);
  CHECK(stats_of(t).max == 0.0);
  nn::init::ones_(t);
  CHECK(stats_of(t).min == 1.0);
  CHECK(t.requires_grad());
}

TEST_CASE("init: kaiming and xavier bounds and standard deviations") {
  Generator gen(21);
  using nn::init::FanMode;
  using nn::init::Nonlinearity;
  // a = sqrt(5), fan_in: bound = 1 / sqrt(fan_in), Linear's and Conv2d's default.
  Tensor w = empty({256, 16, 3, 3});
  nn::init::kaiming_uniform_(w, std::sqrt(5.0), FanMode::FanIn, Nonlinearity::LeakyRelu, &gen);
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  Stats s = stats_of(w);
  CHECK(s.max <= bound);
  CHECK(s.min >= -bound);
  CHECK(s.max > 0.99 * bound);
  CHECK(s.min < -0.99 * bound);
  CHECK(s.std == doctest::Approx(bound / std::sqrt(3.0)).epsilon(0.02));

  // Defaults (a = 0, leaky_relu): gain sqrt(2), bound sqrt(6 / fan_in); fan_out mode.
  Tensor w2 = empty({64, 512});
  nn::init::kaiming_uniform_(w2, 0.0, FanMode::FanOut, Nonlinearity::LeakyRelu, &gen);
  CHECK(stats_of(w2).max <= std::sqrt(6.0 / 64.0));
  CHECK(stats_of(w2).max > 0.99 * std::sqrt(6.0 / 64.0));

  Tensor w3 = empty({128, 64, 3, 3});
  nn::init::kaiming_normal_(w3, 0.0, FanMode::FanOut, Nonlinearity::Relu, &gen);
  CHECK(stats_of(w3).std == doctest::Approx(std::sqrt(2.0 / (128 * 9))).epsilon(0.02));
  CHECK(std::fabs(stats_of(w3).mean) < 0.002);

  Tensor w4 = empty({300, 200}, DType::Float64);
  nn::init::xavier_uniform_(w4, 2.0, &gen);
  const double xb = 2.0 * std::sqrt(6.0 / 500.0);
  CHECK(stats_of(w4).max <= xb);
  CHECK(stats_of(w4).max > 0.99 * xb);
  CHECK(stats_of(w4).min >= -xb);

  Tensor w5 = empty({300, 200});
  nn::init::xavier_normal_(w5, 1.0, &gen);
  CHECK(stats_of(w5).std == doctest::Approx(std::sqrt(2.0 / 500.0)).epsilon(0.02));
}

TEST_CASE("init: a seed fixes the values; the default generator is used when none is given") {
  Generator a(7), b(7);
  Tensor x = empty({5, 6}), y = empty({5, 6});
  nn::init::kaiming_uniform_(x, 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::Relu, &a);
  nn::init::kaiming_uniform_(y, 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::Relu, &b);
  CHECK(equal_values(x, y));
  nn::init::kaiming_uniform_(y, 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::Relu, &b);
  CHECK_FALSE(equal_values(x, y));  // the generator moved on

  manual_seed(99);
  nn::init::normal_(x);
  manual_seed(99);
  nn::init::normal_(y);
  CHECK(equal_values(x, y));
}

TEST_CASE("init: errors") {
  Tensor ints = zeros({3, 3}, DType::Int64);
  CHECK_THROWS_WITH_AS(nn::init::uniform_(ints), Contains("expected a floating tensor, got int64"), Error);
  CHECK_THROWS_WITH_AS(nn::init::kaiming_uniform_(empty({4})), Contains("at least 2 dims"), Error);
  CHECK_THROWS_WITH_AS(nn::init::uniform_(empty({2}), 1.0, 0.0), Contains("expected a <= b"), Error);
  CHECK_THROWS_WITH_AS(nn::init::normal_(empty({2}), 0.0, -1.0), Contains("expected std >= 0"), Error);
  // An empty weight is left alone (PyTorch only warns).
  Tensor e = empty({0, 3});
  CHECK_NOTHROW(nn::init::kaiming_uniform_(e));
}

// --- Linear ----------------------------------------------------------------------------

TEST_CASE("Linear: names, shapes, default init and forward") {
  Generator gen(1);
  nn::Linear layer(37, 11, true, {}, &gen);
  CHECK(names_and_shapes(layer.named_parameters()) == Expected{{"weight", {11, 37}}, {"bias", {11}}});
  CHECK(layer.named_buffers().empty());
  const double bound = 1.0 / std::sqrt(37.0);
  for (const char* name : {"weight", "bias"}) {
    CAPTURE(name);
    Stats s = stats_of(layer.param(name));
    CHECK(s.max <= bound);
    CHECK(s.min >= -bound);
    CHECK(s.max - s.min > bound);  // spread over the range, not a constant
    CHECK(layer.param(name).requires_grad());
    CHECK(layer.param(name).dtype() == DType::Float32);
  }
  Tensor x = test::random({5, 37}, DType::Float32, 2);
  CHECK_CLOSE(layer(x), linear(x, layer.param("weight"), layer.param("bias")), 0, 0);
  Tensor x3 = test::random({2, 3, 37}, DType::Float32, 3);
  CHECK_CLOSE(layer(test::noncontiguous(x3)), linear(x3, layer.param("weight"), layer.param("bias")), 1e-6, 1e-6);
  CHECK(layer.extra_repr() == "in_features=37, out_features=11, bias=true");
  CHECK(layer.repr() == "Linear(in_features=37, out_features=11, bias=true)");
}

TEST_CASE("Linear: without bias, dtype and device options, gradients") {
  nn::Linear layer(4, 3, false, TensorOptions(DType::Float64, Device("cpu:1")));
  CHECK(names_and_shapes(layer.named_parameters()) == Expected{{"weight", {3, 4}}});
  CHECK(layer.param("weight").dtype() == DType::Float64);
  CHECK(layer.param("weight").device() == Device("cpu:1"));
  CHECK(layer.extra_repr() == "in_features=4, out_features=3, bias=false");
  Tensor x = test::random({6, 4}, DType::Float64, 4).to(Device("cpu:1"));
  Tensor y = layer(x);
  CHECK(y.device() == Device("cpu:1"));
  CHECK_CLOSE(y, linear(x, layer.param("weight")), 0, 0);
  sum(y).backward();
  // d sum(x W^T) / dW = column sums of x, repeated per output.
  CHECK_CLOSE(layer.param("weight").grad(), sum(x, {0}, true).expand({3, 4}), 1e-12, 1e-12);

  CHECK_THROWS_WITH_AS(nn::Linear(4, 3, true, DType::Int64), Contains("Linear: parameters need a floating dtype"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::Linear(-1, 3), Contains("must be non-negative"), Error);
}

// --- Conv2d ----------------------------------------------------------------------------

TEST_CASE("Conv2d: names, shapes, default init, forward with every argument") {
  Generator gen(3);
  nn::Conv2d conv(4, 6, {3, 2}, {2, 1}, {1, 0}, {1, 2}, 2, true, {}, &gen);
  CHECK(names_and_shapes(conv.named_parameters()) == Expected{{"weight", {6, 2, 3, 2}}, {"bias", {6}}});
  const double bound = 1.0 / std::sqrt(2.0 * 3 * 2);
  for (const char* name : {"weight", "bias"}) {
    Stats s = stats_of(conv.param(name));
    CHECK(s.max <= bound);
    CHECK(s.min >= -bound);
  }
  Tensor x = test::random({2, 4, 7, 8}, DType::Float32, 5);
  Tensor expected = conv2d(x, conv.param("weight"), conv.param("bias"), {2, 1}, {1, 0}, {1, 2}, 2);
  CHECK_CLOSE(conv(x), expected, 0, 0);
  CHECK_CLOSE(conv(test::noncontiguous(x)), expected, 1e-5, 1e-5);
  CHECK(conv.extra_repr() == "4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2");
}

TEST_CASE("Conv2d: defaults, no bias, printing and argument errors") {
  nn::Conv2d conv(1, 16, 5, 1, 2);
  CHECK(names_and_shapes(conv.named_parameters()) == Expected{{"weight", {16, 1, 5, 5}}, {"bias", {16}}});
  CHECK(conv.repr() == "Conv2d(1, 16, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))");
  CHECK(stats_of(conv.param("weight")).max <= 1.0 / 5.0);
  nn::Conv2d plain(3, 8, 3, 1, 0, 1, 1, false);
  CHECK(plain.named_parameters().size() == 1);
  CHECK(plain.extra_repr() == "3, 8, kernel_size=(3, 3), stride=(1, 1), bias=false");
  Tensor x = test::random({1, 3, 5, 5}, DType::Float32, 6);
  CHECK_CLOSE(plain(x), conv2d(x, plain.param("weight")), 0, 0);

  CHECK_THROWS_WITH_AS(nn::Conv2d(3, 8, 3, 1, 0, 1, 2), Contains("must both be divisible by groups (2)"), Error);
  CHECK_THROWS_WITH_AS(nn::Conv2d(3, 8, 0), Contains("kernel_size must be positive, got (0, 0)"), Error);
  CHECK_THROWS_WITH_AS(nn::Conv2d(3, 8, 3, {1, 0}), Contains("stride must be positive, got (1, 0)"), Error);
  // A wrong input is the functional op's error.
  CHECK_THROWS_AS(plain(test::random({1, 4, 5, 5}, DType::Float32, 7)), Error);
}

// --- pooling ---------------------------------------------------------------------------

TEST_CASE("pooling layers: forward equals the functional ops; printing") {
  Tensor x = test::random({2, 3, 9, 8}, DType::Float64, 8);
  nn::MaxPool2d max_default(2);
  CHECK_CLOSE(max_default(x), max_pool2d(x, {2, 2}, {2, 2}), 0, 0);
  CHECK(max_default.repr() == "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=false)");
  nn::MaxPool2d max_full({3, 2}, nn::Int2{2, 1}, 1, {1, 2}, true);
  CHECK_CLOSE(max_full(test::noncontiguous(x)), max_pool2d(x, {3, 2}, {2, 1}, {1, 1}, {1, 2}, true), 0, 0);
  CHECK(max_full.extra_repr() ==
        "kernel_size=(3, 2), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=true");

  nn::AvgPool2d avg(3, 2, 1, true, false);
  CHECK_CLOSE(avg(x), avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, true, false), 0, 0);
  CHECK(avg.repr() == "AvgPool2d(kernel_size=3, stride=2, padding=1)");
  nn::AvgPool2d avg_default(2);
  CHECK_CLOSE(avg_default(x), avg_pool2d(x, {2, 2}), 0, 0);

  nn::AdaptiveAvgPool2d adaptive({4, 3});
  CHECK_CLOSE(adaptive(x), adaptive_avg_pool2d(x, {4, 3}), 0, 0);
  CHECK(adaptive.repr() == "AdaptiveAvgPool2d(output_size=(4, 3))");
  CHECK(nn::AdaptiveAvgPool2d(1).repr() == "AdaptiveAvgPool2d(output_size=1)");

  CHECK_THROWS_WITH_AS(nn::MaxPool2d(2, 2, 2), Contains("at most half of kernel_size"), Error);
  CHECK_THROWS_WITH_AS(nn::AvgPool2d(0), Contains("AvgPool2d: kernel_size must be positive"), Error);
  CHECK_THROWS_WITH_AS(nn::AdaptiveAvgPool2d(0), Contains("output_size must be positive"), Error);
}

// --- BatchNorm2d ---------------------------------------------------------------------

TEST_CASE("BatchNorm2d: names, defaults and printing") {
  nn::BatchNorm2d bn(5);
  CHECK(names_and_shapes(bn.named_parameters()) == Expected{{"weight", {5}}, {"bias", {5}}});
  CHECK(names_and_shapes(bn.named_buffers()) ==
        Expected{{"running_mean", {5}}, {"running_var", {5}}, {"num_batches_tracked", {}}});
  CHECK(bn.buffer("num_batches_tracked").dtype() == DType::Int64);
  CHECK(bn.buffer("num_batches_tracked").item() == 0);
  CHECK(stats_of(bn.param("weight")).min == 1.0);
  CHECK(stats_of(bn.param("bias")).max == 0.0);
  CHECK(stats_of(bn.buffer("running_mean")).max == 0.0);
  CHECK(stats_of(bn.buffer("running_var")).min == 1.0);
  CHECK_FALSE(bn.buffer("running_mean").requires_grad());
  CHECK(bn.repr() == "BatchNorm2d(5, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)");

  nn::BatchNorm2d bare(3, 1e-3, std::nullopt, false, false);
  CHECK(bare.named_parameters().empty());
  CHECK(bare.named_buffers().empty());
  CHECK(bare.extra_repr() == "3, eps=0.001, momentum=None, affine=false, track_running_stats=false");
}

TEST_CASE("BatchNorm2d: training uses batch stats and updates the running stats; eval uses them") {
  nn::BatchNorm2d bn(3, 1e-5, 0.1, true, true, DType::Float64);
  {
    NoGradGuard no_grad;
    bn.param("weight").copy_(test::random({3}, DType::Float64, 9));
    bn.param("bias").copy_(test::random({3}, DType::Float64, 10));
  }
  Tensor x = test::random({4, 3, 5, 6}, DType::Float64, 11, -1, 3);
  CHECK(bn.is_training());
  Tensor rm = zeros({3}, DType::Float64), rv = ones({3}, DType::Float64);
  Tensor expected = batch_norm(x, rm, rv, bn.param("weight"), bn.param("bias"), true, 0.1, 1e-5);
  CHECK_CLOSE(bn(x), expected, 0, 0);
  CHECK_CLOSE(bn.buffer("running_mean"), rm, 0, 0);
  CHECK_CLOSE(bn.buffer("running_var"), rv, 0, 0);
  // Independently: running_mean = 0.1 * batch mean, running_var = 0.9 + 0.1 * unbiased var.
  CHECK_CLOSE(bn.buffer("running_mean"), mul(mean(x, {0, 2, 3}), 0.1), 1e-12, 1e-12);
  CHECK_CLOSE(bn.buffer("running_var"), add(mul(var(x, {0, 2, 3}, 1), 0.1), 0.9), 1e-12, 1e-12);
  CHECK(bn.buffer("num_batches_tracked").item() == 1);
  bn(x);
  CHECK(bn.buffer("num_batches_tracked").item() == 2);

  bn.eval();
  Tensor before = bn.buffer("running_mean").clone();
  Tensor y = bn(x);
  CHECK_CLOSE(y,
              batch_norm(x, bn.buffer("running_mean"), bn.buffer("running_var"), bn.param("weight"),
                         bn.param("bias"), false, 0.1, 1e-5),
              0, 0);
  CHECK_CLOSE(bn.buffer("running_mean"), before, 0, 0);  // untouched in eval
  CHECK(bn.buffer("num_batches_tracked").item() == 2);
  // Gradients reach the affine parameters in eval too.
  sum(y).backward();
  CHECK(bn.param("weight").grad().defined());

  bn.train();
  CHECK(bn.is_training());
  bn(x);
  CHECK(bn.buffer("num_batches_tracked").item() == 3);
  bn.reset_running_stats();
  CHECK(bn.buffer("num_batches_tracked").item() == 0);
  CHECK(stats_of(bn.buffer("running_var")).min == 1.0);
}

TEST_CASE("BatchNorm2d: momentum None is a cumulative average; no running stats means batch stats") {
  nn::BatchNorm2d bn(2, 1e-5, std::nullopt, true, true, DType::Float64);
  Tensor a = test::random({3, 2, 4, 4}, DType::Float64, 12);
  Tensor b = test::random({3, 2, 4, 4}, DType::Float64, 13, 1, 2);
  bn(a);
  bn(b);
  // Factor 1 then 1/2: the running mean is the plain average of the two batch means.
  Tensor expected = mul(add(mean(a, {0, 2, 3}), mean(b, {0, 2, 3})), 0.5);
  CHECK_CLOSE(bn.buffer("running_mean"), expected, 1e-12, 1e-12);

  nn::BatchNorm2d untracked(2, 1e-5, 0.1, false, false, DType::Float64);
  untracked.eval();
  CHECK_CLOSE(untracked(a), batch_norm(a, Tensor(), Tensor(), Tensor(), Tensor(), true), 0, 0);

  CHECK_THROWS_WITH_AS(bn(test::random({3, 2, 4}, DType::Float64, 14)), Contains("expected a 4-d input"), Error);
  CHECK_THROWS_WITH_AS(bn(test::random({3, 4, 2, 2}, DType::Float64, 14)), Contains("expected 2 channels"), Error);
}

// --- activations -----------------------------------------------------------------------

TEST_CASE("ReLU, GELU and Flatten equal their functional ops") {
  Tensor x = test::random({2, 3, 4, 5}, DType::Float32, 15);
  nn::ReLU relu_layer;
  nn::GELU gelu_layer;
  CHECK_CLOSE(relu_layer(x), relu(x), 0, 0);
  CHECK_CLOSE(gelu_layer(x), gelu(x), 0, 0);
  CHECK(relu_layer.repr() == "ReLU()");
  CHECK(gelu_layer.repr() == "GELU(approximate='none')");
  nn::GELU gelu_tanh_layer(GeluApproximate::Tanh);
  CHECK_CLOSE(gelu_tanh_layer(x), gelu(x, GeluApproximate::Tanh), 0, 0);
  CHECK(gelu_tanh_layer.repr() == "GELU(approximate='tanh')");
  CHECK(gelu_tanh_layer.clone()->repr() == "GELU(approximate='tanh')");
  nn::Flatten flatten;
  CHECK(flatten(x).shape() == Shape{2, 60});
  CHECK_CLOSE(flatten(x), x.reshape({2, 60}), 0, 0);
  CHECK(nn::Flatten(1, 2)(x).shape() == Shape{2, 12, 5});
  CHECK(nn::Flatten(0, -1)(x).shape() == Shape{120});
  CHECK(flatten.repr() == "Flatten(start_dim=1, end_dim=-1)");
}

TEST_CASE("Dropout: scaled mask in training, identity in eval, reproducible with a generator") {
  Tensor x = test::random({40, 50}, DType::Float64, 16, 1, 2);
  Generator gen(17);
  nn::Dropout drop(0.25, &gen);
  CHECK(drop.repr() == "Dropout(p=0.25)");
  Tensor y = drop(x);
  auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  int64_t zeroed = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0.0) {
      ++zeroed;
    } else {
      CHECK(yv[i] == doctest::Approx(xv[i] / 0.75));
    }
  }
  CHECK(std::fabs(double(zeroed) / double(xv.size()) - 0.25) < 0.04);
  // The same stream position gives the same mask as the functional op.
  Generator again(17);
  CHECK_CLOSE(y, dropout(x, 0.25, true, &again), 0, 0);

  drop.eval();
  CHECK(drop(x).is_same(x));
  CHECK_THROWS_WITH_AS(nn::Dropout(1.5), Contains("must be in [0, 1], got 1.5"), Error);
}

// --- Sequential ----------------------------------------------------------------------

TEST_CASE("Sequential: children named by index, applied in order") {
  Generator gen(18);
  auto first = std::make_shared<nn::Linear>(6, 4, true, TensorOptions(), &gen);
  nn::Sequential seq(first, std::make_shared<nn::ReLU>());
  seq.push_back(std::make_shared<nn::Linear>(4, 2, true, TensorOptions(), &gen));
  CHECK(seq.size() == 3);
  CHECK(&seq[0] == first.get());
  CHECK(seq[1].type_name() == "ReLU");
  CHECK(names_and_shapes(seq.named_parameters()) ==
        Expected{{"0.weight", {4, 6}}, {"0.bias", {4}}, {"2.weight", {2, 4}}, {"2.bias", {2}}});
  Tensor x = test::random({3, 6}, DType::Float32, 19);
  Tensor expected = seq[2](relu(seq[0](x)));
  CHECK_CLOSE(seq(x), expected, 0, 0);
  CHECK(seq.repr() ==
        "Sequential(\n"
        "  (0): Linear(in_features=6, out_features=4, bias=true)\n"
        "  (1): ReLU()\n"
        "  (2): Linear(in_features=4, out_features=2, bias=true)\n"
        ")");
  CHECK_THROWS_WITH_AS(seq[3], Contains("index 3 is out of range for 3 modules"), Error);
  CHECK_THROWS_WITH_AS(seq.push_back(nullptr), Contains("cannot add a null module at index 3"), Error);

  nn::Sequential from_list(std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::GELU>()});
  CHECK(from_list.size() == 1);
  nn::Sequential empty_seq;
  CHECK(empty_seq.empty());
  CHECK(empty_seq(x).is_same(x));
}

// --- losses ----------------------------------------------------------------------------

TEST_CASE("loss modules equal the functional losses with their options") {
  Tensor logits = test::random({6, 4}, DType::Float64, 20);
  Tensor target = tensor(std::vector<int64_t>{0, 3, 1, 1, 2, 3});
  Tensor weight = test::random({4}, DType::Float64, 21, 0.5, 2);

  nn::CrossEntropyLoss ce;
  CHECK_CLOSE(ce(logits, target), cross_entropy(logits, target), 0, 0);
  nn::CrossEntropyLoss ce_opts({.weight = weight, .ignore_index = 1, .reduction = Reduction::Sum,
                                .label_smoothing = 0.2});
  CHECK_CLOSE(ce_opts(logits, target), cross_entropy(logits, target, Reduction::Sum, 1, weight, 0.2), 0, 0);
  nn::CrossEntropyLoss ce_none({.reduction = Reduction::None});
  CHECK(ce_none(logits, target).shape() == Shape{6});

  Tensor log_probs = log_softmax(logits, 1);
  nn::NLLLoss nll;
  CHECK_CLOSE(nll(log_probs, target), nll_loss(log_probs, target), 0, 0);
  nn::NLLLoss nll_opts({.weight = weight, .ignore_index = 3, .reduction = Reduction::Mean});
  CHECK_CLOSE(nll_opts(log_probs, target), nll_loss(log_probs, target, Reduction::Mean, 3, weight), 0, 0);
  // NLLLoss of log_softmax is CrossEntropyLoss.
  CHECK_CLOSE(nll(log_probs, target), ce(logits, target), 1e-12, 1e-12);

  Tensor a = test::random({3, 5}, DType::Float32, 22), b = test::random({3, 5}, DType::Float32, 23);
  CHECK_CLOSE(nn::MSELoss()(a, b), mse_loss(a, b), 0, 0);
  CHECK_CLOSE(nn::MSELoss(Reduction::Sum)(a, b), mse_loss(a, b, Reduction::Sum), 0, 0);

  // The class weight follows the model to another device.
  nn::CrossEntropyLoss moved({.weight = weight});
  moved.to(Device("cpu:1"));
  CHECK(moved.options().weight.device() == Device("cpu:1"));
  CHECK_CLOSE(moved(logits.to(Device("cpu:1")), target.to(Device("cpu:1"))), cross_entropy(logits, target, Reduction::Mean, -100, weight), 1e-12, 1e-12);

  CHECK_THROWS_WITH_AS(nn::CrossEntropyLoss({.label_smoothing = 1.5}), Contains("label_smoothing must be in [0, 1]"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::NLLLoss({.weight = ones({2, 2})}), Contains("weight must be a 1-d tensor"), Error);
}

// --- gradients through the layers ------------------------------------------------------

TEST_CASE("gradcheck: Conv2d, BatchNorm2d, pooling and Linear layers in float64") {
  Generator gen(24);
  nn::Conv2d conv(2, 3, 3, 2, 1, 1, 1, true, DType::Float64, &gen);
  nn::BatchNorm2d bn(3, 1e-5, 0.1, true, true, DType::Float64);
  nn::AvgPool2d pool(2, 1);
  nn::Linear fc(3 * 2 * 2, 2, true, DType::Float64, &gen);
  Tensor x = test::leaf({2, 2, 5, 5}, 25);
  std::vector<Tensor> inputs{x, conv.param("weight"), conv.param("bias"), bn.param("weight"), bn.param("bias"),
                             fc.param("weight"), fc.param("bias")};
  auto fn = [&](const std::vector<Tensor>& in) { return fc(pool(gelu(bn(conv(in[0])))).flatten(1)); };
  CHECK_GRADCHECK(fn, inputs);
}
