// layer_norm: forward against a direct float64 computation, gradients by finite differences
// (in x, weight and bias, with and without the affine parameters, over one and two
// normalised dims, non-contiguous inputs), empty inputs, results independent of the thread
// count, and error texts.
#include "test_util.h"

#include <cmath>
#include <vector>

#include "kernels/layer_norm.h"
#include "kernels/layer_norm_kernels.h"

using namespace weft;
using doctest::Contains;
using V = std::vector<Tensor>;

namespace {

// y = (x - mean) / sqrt(var + eps) * weight + bias per row of n values, from the definition.
Tensor reference_layer_norm(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps) {
  const std::vector<double> v = x.detach().contiguous().to_vector<double>();
  const std::vector<double> w = weight.defined() ? weight.detach().contiguous().to_vector<double>()
                                                 : std::vector<double>(n, 1.0);
  const std::vector<double> b = bias.defined() ? bias.detach().contiguous().to_vector<double>()
                                               : std::vector<double>(n, 0.0);
  std::vector<double> out(v.size());
  for (size_t r = 0; r * n < v.size(); ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += v[r * n + i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (v[r * n + i] - mean) * (v[r * n + i] - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = (v[r * n + i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  }
  return tensor(out, x.shape());
}

struct Case {
  Shape input, normalized;
};

}  // namespace

TEST_CASE("layer_norm matches a direct computation") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double tol = dtype == DType::Float32 ? 1e-5 : 1e-12;
    for (const Case& c : {Case{{5, 7}, {7}}, Case{{2, 3, 4}, {3, 4}}, Case{{4, 1}, {1}}, Case{{9}, {9}},
                          Case{{3, 2, 1, 1100}, {1100}}, Case{{2, 3}, {2, 3}}}) {
      CAPTURE(c.input);
      CAPTURE(c.normalized);
      const int64_t n = c.normalized.numel();
      Tensor x = test::random(c.input, dtype, 1);
      Tensor w = test::random(c.normalized, dtype, 2), b = test::random(c.normalized, dtype, 3);
      CHECK_CLOSE(layer_norm(x, c.normalized, w, b), reference_layer_norm(x, n, w, b, 1e-5), tol, tol);
      CHECK_CLOSE(layer_norm(x, c.normalized), reference_layer_norm(x, n, Tensor(), Tensor(), 1e-5), tol, tol);
      CHECK_CLOSE(layer_norm(x, c.normalized, w), reference_layer_norm(x, n, w, Tensor(), 1e-5), tol, tol);
      CHECK_CLOSE(layer_norm(x, c.normalized, Tensor(), b, 0.1), reference_layer_norm(x, n, Tensor(), b, 0.1), tol,
                  tol);
      // Non-contiguous input, weight and bias.
      Tensor xn = test::noncontiguous(x), wn = test::noncontiguous(w), bn = test::noncontiguous(b);
      CHECK_CLOSE(layer_norm(xn, c.normalized, wn, bn), reference_layer_norm(xn, n, w, b, 1e-5), tol, tol);
    }
    // A mean that dwarfs the spread: the two-pass variance keeps it.
    Tensor shifted = add(test::random({6, 33}, dtype, 4), 1000.0);
    CHECK_CLOSE(layer_norm(shifted, {33}), reference_layer_norm(shifted, 33, Tensor(), Tensor(), 1e-5),
                dtype == DType::Float32 ? 1e-3 : 1e-9, 0);
  }
  // A constant row normalises to 0 (plus bias); with eps 0 it is 0 / 0 = NaN, as in PyTorch.
  Tensor constant = full({2, 5}, 3.0, DType::Float64);
  Tensor b = test::random({5}, DType::Float64, 5);
  CHECK_CLOSE(layer_norm(constant, {5}, Tensor(), b), b.expand({2, 5}), 0, 0);
  for (double v : layer_norm(constant, {5}, Tensor(), Tensor(), 0.0).to_vector<double>()) CHECK(std::isnan(v));
}

TEST_CASE("layer_norm: gradients in x, weight and bias") {
  for (const Case& c : {Case{{4, 6}, {6}}, Case{{2, 3, 4}, {3, 4}}, Case{{3, 1}, {1}}, Case{{2, 2, 5}, {5}}}) {
    CAPTURE(c.input);
    Tensor x = test::leaf(c.input, 11);
    Tensor w = test::leaf(c.normalized, 12), b = test::leaf(c.normalized, 13);
    const Shape ns = c.normalized;
    CHECK_GRADCHECK([ns](const V& in) { return layer_norm(in[0], ns, in[1], in[2]); }, (V{x, w, b}));
    CHECK_GRADCHECK([ns](const V& in) { return layer_norm(in[0], ns); }, (V{x}));
    CHECK_GRADCHECK([ns](const V& in) { return layer_norm(in[0], ns, in[1]); }, (V{x, w}));
    CHECK_GRADCHECK([ns](const V& in) { return layer_norm(in[0], ns, Tensor(), in[1], 0.5); }, (V{x, b}));
    // Only the parameters require grad; x is held fixed.
    Tensor fixed = test::random(c.input, DType::Float64, 14);
    CHECK_GRADCHECK([=](const V& in) { return layer_norm(fixed, ns, in[0], in[1]); }, (V{w, b}));
    CHECK_GRADCHECK([=](const V& in) { return layer_norm(fixed, ns, in[0]); }, (V{w}));
    // Non-contiguous x and weight.
    Tensor xn = test::noncontiguous(x).requires_grad_(), wn = test::noncontiguous(w).requires_grad_();
    CHECK_GRADCHECK([ns](const V& in) { return layer_norm(in[0], ns, in[1], in[2]); }, (V{xn, wn, b}));
  }
  // Through a composition, and with a gradient that reaches x twice.
  Tensor x = test::leaf({3, 5}, 15), w = test::leaf({5}, 16);
  CHECK_GRADCHECK([](const V& in) { return mul(layer_norm(in[0], {5}, in[1]), in[0]); }, (V{x, w}));
}

TEST_CASE("layer_norm: the backward matches the formula on a larger input") {
  // Rows beyond one parameter-gradient block (64 of them), and a gradient in float32.
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double tol = dtype == DType::Float32 ? 1e-4 : 1e-10;
    Tensor x0 = test::random({300, 19}, dtype, 21), w0 = test::random({19}, dtype, 22);
    Tensor b0 = test::random({19}, dtype, 23), g = test::random({300, 19}, dtype, 24);
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    layer_norm(x, {19}, w, b).backward(g);
    // The same gradients through float64 autograd of the definition.
    Tensor xd = x0.to(DType::Float64).requires_grad_(), wd = w0.to(DType::Float64).requires_grad_();
    Tensor bd = b0.to(DType::Float64).requires_grad_();
    Tensor centred = sub(xd, mean(xd, {1}, true));
    Tensor var = mean(mul(centred, centred), {1}, true);
    add(mul(div(centred, sqrt(add(var, 1e-5))), wd), bd).backward(g.to(DType::Float64));
    CHECK_CLOSE(x.grad(), xd.grad(), tol, tol);
    CHECK_CLOSE(w.grad(), wd.grad(), tol, tol);
    CHECK_CLOSE(b.grad(), bd.grad(), tol, tol);
  }
}

TEST_CASE("layer_norm: empty inputs") {
  Tensor x = zeros({0, 4}, DType::Float64).requires_grad_();
  Tensor w = test::leaf({4}, 31), b = test::leaf({4}, 32);
  Tensor y = layer_norm(x, {4}, w, b);
  CHECK(y.shape() == Shape{0, 4});
  sum(y).backward();
  CHECK(x.grad().shape() == Shape{0, 4});
  CHECK(w.grad().to_vector<double>() == std::vector<double>(4, 0.0));
  CHECK(b.grad().to_vector<double>() == std::vector<double>(4, 0.0));
  CHECK(layer_norm(zeros({3, 0}), {0}).shape() == Shape{3, 0});
}

TEST_CASE("layer_norm: forward and backward do not depend on the thread count") {
  // Large enough that rows, parameter-gradient blocks and columns all split across threads.
  Tensor x = test::random({700, 129}, DType::Float32, 41), w = test::random({129}, DType::Float32, 42);
  Tensor b = test::random({129}, DType::Float32, 43), g = test::random({700, 129}, DType::Float32, 44);
  const int threads = num_threads();
  std::vector<std::vector<float>> results[3];
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    Tensor xi = x.clone().requires_grad_(), wi = w.clone().requires_grad_(), bi = b.clone().requires_grad_();
    Tensor y = layer_norm(xi, {129}, wi, bi);
    y.backward(g);
    for (const Tensor& r : {y, xi.grad(), wi.grad(), bi.grad()}) results[t - 1].push_back(r.to_vector<float>());
  }
  set_num_threads(threads);
  for (int i = 0; i < 4; ++i) {
    CHECK(results[0][i] == results[1][i]);
    CHECK(results[0][i] == results[2][i]);
  }
}

TEST_CASE("layer_norm kernels write every output element") {
  // Outputs poisoned with NaN: anything a kernel skips stays NaN.
  Tensor x = test::random({37, 11}, DType::Float64, 51), w = test::random({11}, DType::Float64, 52);
  Tensor b = test::random({11}, DType::Float64, 53), g = test::random({37, 11}, DType::Float64, 54);
  const double nan = std::nan("");
  Tensor y = full({37, 11}, nan, DType::Float64), mean = full({37}, nan, DType::Float64);
  Tensor rstd = full({37}, nan, DType::Float64);
  layer_norm_forward_stub(kCPU, x, w, b, 1e-5, y, mean, rstd);
  CHECK_CLOSE(y, reference_layer_norm(x, 11, w, b, 1e-5), 1e-12, 1e-12);
  for (const Tensor& weight : {w, Tensor()}) {
    Tensor gx = full({37, 11}, nan, DType::Float64), gw = full({11}, nan, DType::Float64);
    Tensor gb = full({11}, nan, DType::Float64);
    layer_norm_backward_stub(kCPU, g, x, mean, rstd, weight, gx, gw, gb);
    for (const Tensor& t : {gx, gw, gb})
      for (double v : t.to_vector<double>()) CHECK(std::isfinite(v));
  }
}

TEST_CASE("layer_norm: errors") {
  Tensor x = test::random({2, 3, 4}, DType::Float64, 61);
  Tensor w = test::random({4}, DType::Float64, 62);
  CHECK_THROWS_WITH_AS(layer_norm(x, {3}),
                       Contains("layer_norm: input shape [2, 3, 4] does not end with normalized_shape [3] (expected "
                                "input of shape [*, 3])"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {2, 3, 4, 1}), Contains("does not end with normalized_shape [2, 3, 4, 1]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, Shape{}), Contains("layer_norm: normalized_shape must have at least one dim"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, test::random({3}, DType::Float64, 63)),
                       Contains("layer_norm: expected weight of shape [4] (normalized_shape), got shape [3]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {3, 4}, w),
                       Contains("layer_norm: expected weight of shape [3, 4] (normalized_shape), got shape [4]"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, w, test::random({1, 4}, DType::Float64, 64)),
                       Contains("layer_norm: expected bias of shape [4] (normalized_shape), got shape [1, 4]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, w.to(DType::Float32)),
                       Contains("layer_norm: weight is float32 but input is float64"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, w, w.to(DType::Float32)),
                       Contains("layer_norm: bias is float32 but input is float64"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, w.to(Device("cpu:1"))),
                       Contains("layer_norm: weight is on cpu:1 but input is on cpu"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(arange(12).view({3, 4}), {4}),
                       Contains("layer_norm: expected a float32 or float64 tensor, got int64"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, w, Tensor(), -1.0), Contains("layer_norm: eps must be non-negative, got -1"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(Tensor(), {4}), Contains("layer_norm: argument 'input' is an undefined tensor"),
                       Error);
}
