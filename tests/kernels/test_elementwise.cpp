// Elementwise ops: forward against float64 references written here, broadcasting,
// non-contiguous inputs, in-place variants, gradients and error texts.
#include "test_util.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

#include "kernels/elementwise_kernels.h"
#include "kernels/host_device_math.h"

using namespace weft;
using doctest::Contains;

namespace {

// Reference: applies f elementwise over the broadcast of a and b, in float64.
Tensor reference_binary(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  Shape shape = broadcast_shapes(a.shape(), b.shape(), "reference");
  auto av = a.detach().expand(shape).contiguous().to_vector<double>();
  auto bv = b.detach().expand(shape).contiguous().to_vector<double>();
  std::vector<double> out(av.size());
  for (size_t i = 0; i < av.size(); ++i) out[i] = f(av[i], bv[i]);
  return tensor(out, shape);
}

Tensor reference_unary(const Tensor& x, const std::function<double(double)>& f) {
  auto v = x.detach().to_vector<double>();
  for (double& e : v) e = f(e);
  return tensor(v, x.shape());
}

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

// PyTorch's approximate='tanh' and its derivative, written from the definition.
constexpr double kSqrt2OverPi = 0.79788456080286535588;
double gelu_tanh_ref(double x) { return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad_ref(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
}

}  // namespace

TEST_CASE("binary ops broadcast and match the reference") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    double tol = dtype == DType::Float32 ? 1e-5 : 1e-12;
    Tensor a = test::random({3, 1, 5}, dtype, 1);
    Tensor b = test::random({4, 1}, dtype, 2, 0.5, 2.0);
    CHECK_CLOSE(add(a, b), reference_binary(a, b, [](double x, double y) { return x + y; }), tol, tol);
    CHECK_CLOSE(sub(a, b), reference_binary(a, b, [](double x, double y) { return x - y; }), tol, tol);
    CHECK_CLOSE(mul(a, b), reference_binary(a, b, [](double x, double y) { return x * y; }), tol, tol);
    CHECK_CLOSE(div(a, b), reference_binary(a, b, [](double x, double y) { return x / y; }), tol, tol);
    CHECK_CLOSE(pow(b, a), reference_binary(b, a, [](double x, double y) { return std::pow(x, y); }), tol, tol);
    CHECK_CLOSE(maximum(a, b), reference_binary(a, b, [](double x, double y) { return std::max(x, y); }), 0, 0);
    CHECK_CLOSE(minimum(a, b), reference_binary(a, b, [](double x, double y) { return std::min(x, y); }), 0, 0);
    // Non-contiguous operands take the strided path.
    Tensor an = test::noncontiguous(test::random({6, 7}, dtype, 3));
    Tensor bn = test::noncontiguous(test::random({6, 7}, dtype, 4));
    CHECK_CLOSE(mul(an, bn), reference_binary(an, bn, [](double x, double y) { return x * y; }), tol, tol);
    CHECK_CLOSE(add(an, bn.select(0, 2)), reference_binary(an, bn.select(0, 2), std::plus<double>()), tol, tol);
  }
  Tensor i = tensor(std::vector<int64_t>{1, -2, 3}), j = tensor(std::vector<int64_t>{4, 5, -6});
  CHECK(add(i, j).to_vector<int64_t>() == std::vector<int64_t>{5, 3, -3});
  CHECK(mul(i, j).to_vector<int64_t>() == std::vector<int64_t>{4, -10, -18});
  CHECK(maximum(i, j).to_vector<int64_t>() == std::vector<int64_t>{4, 5, 3});
}

TEST_CASE("large operands take the multi-threaded path and agree") {
  Tensor a = test::random({300, 401}, DType::Float32, 5);
  Tensor b = test::random({401}, DType::Float32, 6);
  CHECK_CLOSE(add(a, b), reference_binary(a, b, std::plus<double>()), 1e-6, 1e-6);
  CHECK_CLOSE(exp(a), reference_unary(a, [](double x) { return std::exp(x); }), 1e-6, 1e-6);
  Tensor t = test::noncontiguous(a);
  CHECK_CLOSE(mul(t, 2.0), reference_unary(t, [](double x) { return 2 * x; }), 1e-6, 1e-6);
}

TEST_CASE("unary ops match the reference") {
  Tensor x = test::random({4, 5}, DType::Float64, 7);
  Tensor pos = test::random({4, 5}, DType::Float64, 8, 0.1, 3.0);
  CHECK_CLOSE(neg(x), reference_unary(x, [](double v) { return -v; }), 0, 0);
  CHECK_CLOSE(exp(x), reference_unary(x, [](double v) { return std::exp(v); }), 1e-12, 1e-12);
  CHECK_CLOSE(log(pos), reference_unary(pos, [](double v) { return std::log(v); }), 1e-12, 1e-12);
  CHECK_CLOSE(sqrt(pos), reference_unary(pos, [](double v) { return std::sqrt(v); }), 1e-12, 1e-12);
  CHECK_CLOSE(abs(x), reference_unary(x, [](double v) { return std::fabs(v); }), 0, 0);
  CHECK_CLOSE(relu(x), reference_unary(x, [](double v) { return v > 0 ? v : 0; }), 0, 0);
  CHECK_CLOSE(sigmoid(x), reference_unary(x, [](double v) { return 1 / (1 + std::exp(-v)); }), 1e-12, 1e-12);
  CHECK_CLOSE(tanh(x), reference_unary(x, [](double v) { return std::tanh(v); }), 1e-12, 1e-12);
  CHECK_CLOSE(gelu(x), reference_unary(x, gelu_ref), 1e-12, 1e-12);
  CHECK_CLOSE(pow(pos, 1.5), reference_unary(pos, [](double v) { return std::pow(v, 1.5); }), 1e-12, 1e-12);
  CHECK_CLOSE(clamp(x, -0.5, 0.5), reference_unary(x, [](double v) { return std::clamp(v, -0.5, 0.5); }), 0, 0);
  CHECK_CLOSE(clamp(x, std::nullopt, 0.2), reference_unary(x, [](double v) { return std::min(v, 0.2); }), 0, 0);
  CHECK_CLOSE(add(x, 2.5), reference_unary(x, [](double v) { return v + 2.5; }), 1e-12, 0);
  CHECK_CLOSE(div(x, 4.0), reference_unary(x, [](double v) { return v / 4.0; }), 1e-15, 1e-15);
  CHECK_CLOSE(3.0 - x, reference_unary(x, [](double v) { return 3.0 - v; }), 1e-12, 0);
  // Extreme inputs stay finite where the math is finite.
  Tensor big = tensor(std::vector<float>{-1000, 1000});
  CHECK(sigmoid(big).to_vector<float>() == std::vector<float>{0, 1});
  CHECK(std::isnan(clamp(tensor(std::vector<double>{NAN}), 0.0, 1.0).item()));
}

TEST_CASE("gelu with approximate='tanh': values, gradient kernel and closeness to the exact form") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double tol = dtype == DType::Float32 ? 1e-6 : 1e-14;
    Tensor x = test::random({7, 9}, dtype, 21, -6.0, 6.0);
    CHECK_CLOSE(gelu(x, GeluApproximate::Tanh), reference_unary(x, gelu_tanh_ref), tol, tol);
    CHECK_CLOSE(gelu(x, GeluApproximate::None), gelu(x), 0, 0);
    Tensor g = test::random({7, 9}, dtype, 22);
    CHECK_CLOSE(gelu_backward(g, x, GeluApproximate::Tanh),
                reference_binary(g, x, [](double gv, double xv) { return gv * gelu_tanh_grad_ref(xv); }), tol, tol);
    // Non-contiguous and broadcast operands take the strided loops.
    Tensor xn = test::noncontiguous(x);
    CHECK_CLOSE(gelu(xn, GeluApproximate::Tanh), reference_unary(xn, gelu_tanh_ref), tol, tol);
    Tensor g_row = g.select(0, 1);
    CHECK_CLOSE(gelu_backward(g_row, x, GeluApproximate::Tanh),
                reference_binary(g_row, x, [](double gv, double xv) { return gv * gelu_tanh_grad_ref(xv); }), tol,
                tol);
    // The tanh form is within 5e-4 of the exact one everywhere (its largest gap is 4.7e-4, at x = -2.7).
    CHECK_CLOSE(gelu(x, GeluApproximate::Tanh), gelu(x), 5e-4, 0);
  }
  // Values of torch.nn.functional.gelu(x, approximate='tanh') in float64.
  Tensor anchors = tensor(std::vector<double>{1.0, -2.0, 0.5, 0.0});
  CHECK_CLOSE(gelu(anchors, GeluApproximate::Tanh),
              tensor(std::vector<double>{0.8411919906082768, -0.04540230591222494, 0.34571400982514394, 0.0}), 1e-15,
              1e-15);
  // Far tails: x itself above, 0 below, with no overflow in x^3 turning them into NaN.
  Tensor tails = tensor(std::vector<float>{-30, 30, -1e30f, 1e30f});
  CHECK(gelu(tails, GeluApproximate::Tanh).to_vector<float>() == std::vector<float>{-0.0f, 30, -0.0f, 1e30f});
  CHECK_THROWS_WITH_AS(gelu(arange(3), GeluApproximate::Tanh),
                       Contains("gelu: expected a float32 or float64 tensor, got int64"), Error);
}

TEST_CASE("NaN propagates as in PyTorch: relu, maximum / minimum, clamp, amax / amin, argmax, max(dim)") {
  // Issue 11, item 4: relu(NaN) was 0 and its gradient 0, hiding corruption.
  const double nan = std::nan("");
  Tensor x = tensor(std::vector<double>{1, nan, -2, 3}, Shape{4});
  auto is_nan = [](const Tensor& t, size_t i) { return std::isnan(t.to_vector<double>()[i]); };
  Tensor r = relu(x);
  CHECK(is_nan(r, 1));
  CHECK(r.to_vector<double>()[2] == 0);
  Tensor leaf = x.detach().requires_grad_();
  sum(relu(leaf)).backward();
  CHECK(leaf.grad().to_vector<double>()[1] == 1);  // threshold_backward lets the gradient through
  CHECK(leaf.grad().to_vector<double>()[2] == 0);
  Tensor y = x.clone();
  relu_(y);
  CHECK(is_nan(y, 1));
  const Tensor one = ones({4}, TensorOptions(DType::Float64));
  for (const Tensor& t : {maximum(x, one), maximum(one, x), minimum(x, one), minimum(one, x), clamp(x, 0.0, 2.0)})
    CHECK(is_nan(t, 1));
  CHECK(std::isnan(amax(x).item()));
  CHECK(std::isnan(amin(x).item()));
  CHECK(argmax(x).item<int64_t>() == 1);
  CHECK(argmin(x).item<int64_t>() == 1);
  auto [value, index] = max(x, 0);
  CHECK(std::isnan(value.item()));
  CHECK(index.item<int64_t>() == 1);
}

TEST_CASE("comparisons and where") {
  Tensor a = tensor({1, 2, 3, 4});
  Tensor b = tensor({4, 2, 1, 5});
  CHECK(lt(a, b).dtype() == DType::Bool);
  CHECK(lt(a, b).to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 1});
  CHECK(eq(a, b).to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 0});
  CHECK(ge(a, 3.0).to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1});
  CHECK(ne(a, 2.0).to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1, 1});
  CHECK(where(gt(a, b), a, b).to_vector<float>() == std::vector<float>{4, 2, 3, 5});
  // where broadcasts all three.
  Tensor w = where(gt(a, 2.0).view({4, 1}), ones({1, 3}), zeros({3}));
  CHECK(w.shape() == Shape{4, 3});
  CHECK(sum(w).item() == 6.0);
  CHECK_THROWS_WITH_AS(where(a, a, b), Contains("condition must be a bool tensor, got float32"), Error);
}

TEST_CASE("in-place variants write into self and bump its version") {
  Tensor x = test::random({3, 4}, DType::Float64, 9);
  Tensor expected = add(mul(x, 2.0), test::random({4}, DType::Float64, 10));
  Tensor y = x.clone();
  uint32_t v0 = y.version();
  mul_(y, 2.0);
  add_(y, test::random({4}, DType::Float64, 10));
  CHECK(y.version() == v0 + 2);
  CHECK_CLOSE(y, expected, 1e-12, 1e-12);
  Tensor z = x.clone();
  relu_(z);
  CHECK_CLOSE(z, relu(x), 0, 0);
  clamp_(z, 0.1, 0.3);
  CHECK_CLOSE(z, clamp(relu(x), 0.1, 0.3), 0, 0);
  zero_(z);
  CHECK(sum(abs(z)).item() == 0.0);
  // In place on a strided view writes only the view's elements.
  Tensor m = zeros({4, 4});
  Tensor diag_block = m.slice(0, 0, 4, 2).slice(1, 1, 4, 2);
  add_(diag_block, 1.0);
  CHECK(sum(m).item() == 4.0);
  CHECK(m.to_vector<float>()[1] == 1.f);
  CHECK_THROWS_WITH_AS(add_(zeros({3}), ones({2, 3})), Contains("does not broadcast to self's shape [3]"), Error);
  Tensor xs = x.clone();
  xs += 1.0;
  xs *= x;
  CHECK_CLOSE(xs, mul(add(x, 1.0), x), 1e-12, 1e-12);
}

TEST_CASE("gradients of elementwise ops") {
  using V = std::vector<Tensor>;
  auto a = [] { return test::leaf({3, 1, 4}, 11); };
  auto b = [] { return test::leaf({2, 4}, 12, 0.5, 2.0); };
  CHECK_GRADCHECK([](const V& in) { return add(in[0], in[1]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return sub(in[0], in[1]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return mul(in[0], in[1]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return div(in[0], in[1]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return pow(in[1], in[0]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return maximum(in[0], in[1]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return minimum(in[0], in[1]); }, (V{a(), b()}));
  CHECK_GRADCHECK([](const V& in) { return where(gt(in[0], 0.0), in[0], in[1]); }, (V{a(), b()}));
  // One side without grad, non-contiguous operands.
  Tensor fixed = test::random({2, 4}, DType::Float64, 13);
  CHECK_GRADCHECK([&](const V& in) { return mul(in[0], fixed); }, (V{a()}));
  Tensor nc = test::noncontiguous(test::random({5, 3}, DType::Float64, 14)).requires_grad_();
  CHECK_GRADCHECK([](const V& in) { return mul(exp(in[0]), in[0]); }, (V{nc}));

  Tensor x = test::leaf({2, 3}, 15);
  Tensor pos = test::leaf({2, 3}, 16, 0.2, 2.0);
  CHECK_GRADCHECK([](const V& in) { return neg(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return exp(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return log(in[0]); }, (V{pos}));
  CHECK_GRADCHECK([](const V& in) { return sqrt(in[0]); }, (V{pos}));
  CHECK_GRADCHECK([](const V& in) { return abs(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return relu(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return sigmoid(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return tanh(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return gelu(in[0]); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return gelu(in[0], GeluApproximate::Tanh); }, (V{x}));
  Tensor wide = test::leaf({3, 4}, 23, -4.0, 4.0);
  CHECK_GRADCHECK([](const V& in) { return gelu(in[0], GeluApproximate::Tanh); }, (V{wide}));
  Tensor wide_strided = test::noncontiguous(wide).requires_grad_();
  CHECK_GRADCHECK([](const V& in) { return gelu(in[0], GeluApproximate::Tanh); }, (V{wide_strided}));
  CHECK_GRADCHECK([](const V& in) { return pow(in[0], 3.0); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return pow(in[0], -0.5); }, (V{pos}));
  CHECK_GRADCHECK([](const V& in) { return clamp(in[0], -0.3, 0.4); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return div(add(mul(in[0], 3.0), 1.0), 2.0); }, (V{x}));
  CHECK_GRADCHECK([](const V& in) { return 1.0 / in[0] - in[0]; }, (V{pos}));
}

TEST_CASE("elementwise errors say what is wrong") {
  Tensor f = zeros({2});
  CHECK_THROWS_WITH_AS(add(f, zeros({2}, DType::Float64)), Contains("add: dtype mismatch, float32 and float64"), Error);
  CHECK_THROWS_WITH_AS(mul(f, zeros({3})), Contains("mul: shapes [2] and [3] cannot be broadcast"), Error);
  CHECK_THROWS_WITH_AS(add(f, zeros({2}, Device("cpu:1"))), Contains("add: expected all tensors on one device"), Error);
  Tensor bools = tensor(std::vector<bool>{true, false});
  CHECK_THROWS_WITH_AS(add(bools, bools), Contains("arithmetic on bool tensors"), Error);
  Tensor ints = tensor(std::vector<int64_t>{1, 2});
  CHECK_THROWS_WITH_AS(div(ints, ints), Contains("div: expected a float32 or float64 tensor, got int64"), Error);
  CHECK_THROWS_WITH_AS(mul(ints, 0.5), Contains("scalar 0.5 is not integral but the tensor is int64"), Error);
  CHECK_THROWS_WITH_AS(exp(ints), Contains("exp: expected a float32 or float64 tensor"), Error);
  CHECK_THROWS_WITH_AS(add(Tensor(), f), Contains("add: argument 'a' is an undefined tensor"), Error);
  CHECK_THROWS_WITH_AS(clamp(f, std::nullopt, std::nullopt), Contains("at least one of min and max"), Error);
}

// Note [Integer division by zero]: div() takes floats, but the kernels divide integers too
// (kernels/elementwise_kernels.h), and x / 0 or INT_MIN / -1 must neither trap (SIGFPE) nor
// differ between the CPU and the GPU. Every integer dtype, element by element and with the
// divisor broadcast from one element (the CPU's scalar loop).
template <class T>
void check_integer_division(DType dtype) {
  using Limits = std::numeric_limits<T>;
  const T all_ones = static_cast<T>(~T(0));
  std::vector<T> x, y, expected;
  auto add_case = [&](T a, T b, T q) {
    x.push_back(a);
    y.push_back(b);
    expected.push_back(q);
  };
  add_case(7, 2, 3);
  add_case(0, 5, 0);
  add_case(Limits::max(), 1, Limits::max());
  add_case(Limits::max(), 0, all_ones);
  add_case(0, 0, all_ones);
  add_case(1, 0, all_ones);
  if constexpr (std::is_signed_v<T>) {
    add_case(-7, 2, -3);  // truncated toward zero
    add_case(7, -2, -3);
    add_case(-7, -2, 3);
    add_case(Limits::min(), -1, Limits::min());  // wraps around
    add_case(Limits::max(), -1, static_cast<T>(-Limits::max()));
    add_case(Limits::min(), 1, Limits::min());
    add_case(Limits::min(), 0, T(-1));
    add_case(-1, 0, T(-1));
  } else {
    add_case(200, 3, 66);
    add_case(200, 0, Limits::max());
  }
  const Shape shape{static_cast<int64_t>(x.size())};
  Tensor a = tensor(x, shape, dtype), b = tensor(y, shape, dtype), out = full(shape, 42, dtype);
  binary_stub(kCPU, BinaryOp::Div, a, b, out);
  CHECK(out.to_vector<T>() == expected);
  for (size_t i = 0; i < x.size(); ++i) CHECK(hd::int_div(x[i], y[i]) == expected[i]);

  // Every element over a broadcast zero, then Limits::min() over a broadcast -1.
  Tensor zero = tensor(std::vector<T>{0}, Shape{1}, dtype);
  binary_stub(kCPU, BinaryOp::Div, a, zero.expand(shape), out);
  CHECK(out.to_vector<T>() == std::vector<T>(x.size(), all_ones));
  if constexpr (std::is_signed_v<T>) {
    Tensor minus_one = tensor(std::vector<T>{-1}, Shape{1}, dtype);
    Tensor mins = full({5}, static_cast<double>(Limits::min()), dtype), quotient = empty({5}, dtype);
    binary_stub(kCPU, BinaryOp::Div, mins, minus_one.expand({5}), quotient);
    CHECK(quotient.to_vector<T>() == std::vector<T>(5, Limits::min()));
  }
}

TEST_CASE("integer division in the kernels: x / 0 is all ones, INT_MIN / -1 wraps, no trap") {
  SUBCASE("int64") { check_integer_division<int64_t>(DType::Int64); }
  SUBCASE("int32") { check_integer_division<int32_t>(DType::Int32); }
  SUBCASE("uint8") { check_integer_division<uint8_t>(DType::UInt8); }
}
