// CUDA pointwise kernels against the CPU ones on the same inputs: binary ops with
// broadcasting, unary ops, the fused activation backward kernels, where, comparisons,
// random fills and dropout; contiguous, misaligned, non-contiguous, broadcast, empty and
// large operands; gradients through autograd.
//
// Tolerances (stated once, used throughout):
// - Exact: every op IEEE arithmetic rounds once (add, sub, mul, div, maximum, minimum,
//   neg, abs, sign, relu, sqrt, clamp, add / sub / mul / div by a scalar, where,
//   comparisons, integer ops) must equal the CPU's bit for bit (any NaN matches any NaN).
// - Transcendental (exp, log, tanh, sigmoid, gelu, pow and the backward kernels): CUDA's
//   math library (documented within 1-4 ulp) against glibc's. float64: atol 1e-14 +
//   rtol 1e-12; float32: atol 1e-6 + rtol 1e-5 (the atol covers gelu's 1 + erf(x),
//   which cancels for negative x and turns an ulp of erf into a larger relative error).
// - Random fills: each value is a function of (seed, offset, index) alone. Uniforms and
//   integers are bitwise equal to the CPU's. Normals go through log and cos in double:
//   float32 normals are within 1 ulp of the CPU's, float64 normals within 8 ulp.
// - Dropout: the same generator state gives the same mask, output and gradient bit for
//   bit.
#include "cuda_test_util.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/dropout_kernels.h"
#include "kernels/elementwise_kernels.h"
#include "kernels/random_kernels.h"

using namespace weft;
using test::gpu;
using test::on_gpu;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Position of a float on the number line of representable values (+0 and -0 both 0).
int64_t ordinal(float v) {
  auto bits = std::bit_cast<int32_t>(v);
  return bits < 0 ? -int64_t{bits & 0x7fffffff} : int64_t{bits};
}
int64_t ordinal(double v) {
  auto bits = std::bit_cast<int64_t>(v);
  return bits < 0 ? -(bits & 0x7fffffffffffffff) : bits;
}

// Largest distance in ulp between same-shaped tensors of type T (NaN only matches NaN).
template <class T>
uint64_t max_ulp(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.shape() == expected.shape());
  auto a = actual.to_vector<T>();
  auto e = expected.to_vector<T>();
  uint64_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(e[i])) {
      if (!(std::isnan(a[i]) && std::isnan(e[i]))) return std::numeric_limits<uint64_t>::max();
      continue;
    }
    int64_t x = ordinal(a[i]), y = ordinal(e[i]);
    // Unsigned difference: exact even when the signed one would overflow.
    uint64_t d = x > y ? uint64_t(x) - uint64_t(y) : uint64_t(y) - uint64_t(x);
    worst = std::max(worst, d);
  }
  return worst;
}

// The same values as t (any device), starting one element past a 16-byte boundary: a
// contiguous operand that the packet path must refuse.
Tensor misaligned(const Tensor& t) {
  NoGradGuard no_grad;
  if (t.dim() == 0) return t.clone();
  Tensor buffer = empty({t.numel() + 1}, TensorOptions(t.dtype(), t.device()));
  Tensor view = buffer.slice(0, 1, t.numel() + 1).view(t.shape());
  view.copy_(t);
  return view;
}

using Layout = std::function<Tensor(const Tensor&)>;
struct NamedLayout {
  const char* name;
  Layout apply;
};
const std::vector<NamedLayout> kLayouts = {
    {"contiguous", [](const Tensor& t) { return t; }},
    {"non-contiguous", [](const Tensor& t) { return test::noncontiguous(t); }},
    {"misaligned", [](const Tensor& t) { return misaligned(t); }},
};

// Values of dtype in [lo, hi): uniform float64 converted (truncated) for integer dtypes.
Tensor values(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi) {
  Tensor x = test::random(shape, DType::Float64, seed, lo, hi);
  if (dtype == DType::Bool) return gt(x, (lo + hi) / 2);
  return x.to(dtype);
}

using BinaryCall = std::function<Tensor(const Tensor&, const Tensor&)>;
using UnaryCall = std::function<Tensor(const Tensor&)>;

struct BinaryCase {
  const char* name;
  BinaryCall fn;
  bool exact;
};

// Runs fn on the CPU operands and on the same values on the GPU, laid out alike.
void check_binary(const BinaryCase& c, const Tensor& a, const Tensor& b, const Layout& layout, double atol,
                  double rtol) {
  Tensor expected = c.fn(layout(a), layout(b));
  Tensor actual = c.fn(layout(on_gpu(a)), layout(on_gpu(b)));
  REQUIRE(actual.device() == gpu());
  if (c.exact) CHECK_IDENTICAL(actual, expected);
  else CHECK_GPU_MATCHES(actual, expected, atol, rtol);
}

void check_unary(const UnaryCall& fn, const Tensor& x, bool exact, double atol, double rtol) {
  for (const NamedLayout& layout : kLayouts) {
    CAPTURE(std::string(layout.name));
    Tensor expected = fn(layout.apply(x));
    Tensor actual = fn(layout.apply(on_gpu(x)));
    REQUIRE(actual.device() == gpu());
    if (exact) CHECK_IDENTICAL(actual, expected);
    else CHECK_GPU_MATCHES(actual, expected, atol, rtol);
  }
}

double atol_of(DType dtype) { return dtype == DType::Float32 ? 1e-6 : 1e-14; }
double rtol_of(DType dtype) { return dtype == DType::Float32 ? 1e-5 : 1e-12; }

const std::vector<std::pair<Shape, Shape>> kBinaryShapes = {
    {{1}, {1}},     {{7}, {7}},         {{1000003}, {1000003}}, {{257}, {}}, {{}, {257}},
    {{3, 1, 5}, {4, 1}}, {{64, 33}, {33}}, {{0, 3}, {3}},        {{2, 3, 4, 5}, {3, 1, 5}},
};

}  // namespace

TEST_CASE("binary float ops match the CPU: broadcasting, layouts, odd and empty sizes") {
  const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, true},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, true},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, true},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, false},
  };
  uint64_t seed = 100;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
    for (const auto& shapes : kBinaryShapes) {
      const Shape &sa = shapes.first, &sb = shapes.second;
      // A positive base keeps pow real; b has both signs.
      Tensor a = test::random(sa, dtype, ++seed, 0.5, 2.0);
      Tensor b = test::random(sb, dtype, ++seed);
      for (const NamedLayout& layout : kLayouts) {
        for (const BinaryCase& c : cases) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(sa);
          CAPTURE(sb);
          CAPTURE(std::string(layout.name));
          CAPTURE(std::string(c.name));
          check_binary(c, a, b, layout.apply, atol_of(dtype), rtol_of(dtype));
        }
      }
    }
  }
}

TEST_CASE("binary ops on transposed and step-sliced views") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    Tensor a = test::random({40, 31}, dtype, 1), b = test::random({31, 40}, dtype, 2);
    CHECK_IDENTICAL(add(on_gpu(a), on_gpu(b).t()), add(a, b.t()));
    CHECK_IDENTICAL(mul(on_gpu(a).slice(0, 1, 40, 3), on_gpu(b).t().slice(0, 0, 39, 3)),
                    mul(a.slice(0, 1, 40, 3), b.t().slice(0, 0, 39, 3)));
    // Even columns minus one row of the odd ones (15 columns each).
    CHECK_IDENTICAL(sub(on_gpu(a).slice(1, 0, 30, 2), on_gpu(a).slice(1, 1, 31, 2).select(0, 5)),
                    sub(a.slice(1, 0, 30, 2), a.slice(1, 1, 31, 2).select(0, 5)));
    // A stride-0 expanded operand against a transposed one.
    Tensor row = test::random({40}, dtype, 3);
    CHECK_IDENTICAL(div(on_gpu(row).expand({31, 40}), on_gpu(a).t()), div(row.expand({31, 40}), a.t()));
  }
}

TEST_CASE("binary integer ops match the CPU exactly") {
  const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, true},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, true},
  };
  uint64_t seed = 300;
  for (DType dtype : {DType::Int64, DType::Int32, DType::UInt8}) {
    // uint8 sums and products wrap around, identically on both devices.
    double lo = dtype == DType::UInt8 ? 0 : -1000, hi = dtype == DType::UInt8 ? 250 : 1000;
    for (const auto& shapes : kBinaryShapes) {
      const Shape &sa = shapes.first, &sb = shapes.second;
      Tensor a = values(sa, dtype, ++seed, lo, hi), b = values(sb, dtype, ++seed, lo, hi);
      for (const NamedLayout& layout : kLayouts) {
        for (const BinaryCase& c : cases) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(sa);
          CAPTURE(sb);
          CAPTURE(std::string(layout.name));
          CAPTURE(std::string(c.name));
          check_binary(c, a, b, layout.apply, 0, 0);
        }
      }
    }
  }
}

TEST_CASE("maximum, minimum and comparisons treat NaN, infinities and signed zeros as the CPU does") {
  std::vector<double> x{kNaN, 1, kNaN, -0.0, 0.0, kInf, -kInf, 2, kNaN, 3};
  std::vector<double> y{1, kNaN, kNaN, 0.0, -0.0, kNaN, 3, 2, -kInf, kInf};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    Tensor a = tensor(x).to(dtype), b = tensor(y).to(dtype);
    Tensor ga = on_gpu(a), gb = on_gpu(b);
    CHECK_IDENTICAL(maximum(ga, gb), maximum(a, b));
    CHECK_IDENTICAL(minimum(ga, gb), minimum(a, b));
    CHECK_IDENTICAL(maximum(gb, ga), maximum(b, a));
    CHECK_IDENTICAL(minimum(gb, ga), minimum(b, a));
    CHECK_IDENTICAL(eq(ga, gb), eq(a, b));
    CHECK_IDENTICAL(ne(ga, gb), ne(a, b));
    CHECK_IDENTICAL(lt(ga, gb), lt(a, b));
    CHECK_IDENTICAL(le(ga, gb), le(a, b));
    CHECK_IDENTICAL(gt(ga, gb), gt(a, b));
    CHECK_IDENTICAL(ge(ga, gb), ge(a, b));
    // NaN propagates from either side, as in PyTorch.
    auto mx = maximum(ga, gb).to_vector<double>();
    CHECK(std::isnan(mx[0]));
    CHECK(std::isnan(mx[1]));
    CHECK(std::isnan(mx[5]));
    CHECK(mx[6] == 3);
  }
}

TEST_CASE("comparisons give bool tensors equal to the CPU's, for every dtype") {
  using Cmp = Tensor (*)(const Tensor&, const Tensor&);
  using CmpScalar = Tensor (*)(const Tensor&, double);
  const std::vector<std::pair<Cmp, CmpScalar>> ops = {
      {static_cast<Cmp>(&eq), static_cast<CmpScalar>(&eq)}, {static_cast<Cmp>(&ne), static_cast<CmpScalar>(&ne)},
      {static_cast<Cmp>(&lt), static_cast<CmpScalar>(&lt)}, {static_cast<Cmp>(&le), static_cast<CmpScalar>(&le)},
      {static_cast<Cmp>(&gt), static_cast<CmpScalar>(&gt)}, {static_cast<Cmp>(&ge), static_cast<CmpScalar>(&ge)},
  };
  uint64_t seed = 400;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool}) {
    for (const auto& shapes : kBinaryShapes) {
      const Shape &sa = shapes.first, &sb = shapes.second;
      // Few distinct values, so that ties (eq, le, ge) occur often.
      auto few = [&](const Shape& shape) {
        return dtype == DType::Bool ? values(shape, dtype, ++seed, 0, 1) : values(shape, DType::Int64, ++seed, 0, 4).to(dtype);
      };
      Tensor a = few(sa), b = few(sb);
      for (const NamedLayout& layout : kLayouts) {
        for (const auto& [op, op_scalar] : ops) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(sa);
          CAPTURE(sb);
          CAPTURE(std::string(layout.name));
          Tensor actual = op(layout.apply(on_gpu(a)), layout.apply(on_gpu(b)));
          CHECK(actual.dtype() == DType::Bool);
          CHECK_IDENTICAL(actual, op(layout.apply(a), layout.apply(b)));
          if (dtype != DType::Bool)
            CHECK_IDENTICAL(op_scalar(layout.apply(on_gpu(a)), 2.0), op_scalar(layout.apply(a), 2.0));
        }
      }
    }
  }
}

TEST_CASE("unary float ops match the CPU, exact ones bit for bit") {
  uint64_t seed = 500;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double atol = atol_of(dtype), rtol = rtol_of(dtype);
    for (const Shape& shape : std::vector<Shape>{{}, {1}, {7}, {1000003}, {33, 65}, {0, 4}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(shape);
      Tensor x = mul(test::random(shape, dtype, ++seed), 3.0);  // both signs, |x| up to ~15
      Tensor pos = test::random(shape, dtype, ++seed, 0.01, 10.0);
      // Exact.
      check_unary([](const Tensor& t) { return neg(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return abs(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return sign(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return relu(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return sqrt(t); }, pos, true, 0, 0);
      check_unary([](const Tensor& t) { return clamp(t, -1.5, 2.25); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return clamp(t, 0.5, std::nullopt); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return clamp(t, std::nullopt, -0.25); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return add(t, 2.5); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return sub(t, 1.25); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return mul(t, -3.0); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return div(t, 3.0); }, x, true, 0, 0);
      // Transcendental.
      check_unary([](const Tensor& t) { return exp(t); }, x, false, atol, rtol);
      check_unary([](const Tensor& t) { return log(t); }, pos, false, atol, rtol);
      check_unary([](const Tensor& t) { return tanh(t); }, x, false, atol, rtol);
      check_unary([](const Tensor& t) { return sigmoid(t); }, x, false, atol, rtol);
      check_unary([](const Tensor& t) { return gelu(t); }, x, false, atol, rtol);
      check_unary([](const Tensor& t) { return pow(t, 2.5); }, pos, false, atol, rtol);
      check_unary([](const Tensor& t) { return pow(t, -1.5); }, pos, false, atol, rtol);
      check_unary([](const Tensor& t) { return pow(t, 3.0); }, x, false, atol, rtol);
    }
  }
}

TEST_CASE("unary ops on special values: NaN, infinities, signed zeros, overflow") {
  // Every result here is fixed by IEEE rules (no rounding left to a math library), so
  // the devices must agree bit for bit.
  std::vector<double> any{kNaN, kInf, -kInf, 0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, 2.5, -2.5};
  std::vector<double> limits{kNaN, kInf, -kInf, 0.0, -0.0, 1e30, -1e30};
  std::vector<double> logs{kNaN, kInf, -kInf, 0.0, -0.0, -1.0, 1.0};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype_name(dtype));
    Tensor x = tensor(any).to(dtype), g = on_gpu(x);
    CHECK_IDENTICAL(neg(g), neg(x));
    CHECK_IDENTICAL(abs(g), abs(x));
    CHECK_IDENTICAL(sign(g), sign(x));  // NaN and both zeros give 0
    CHECK_IDENTICAL(relu(g), relu(x));
    CHECK_IDENTICAL(sqrt(g), sqrt(x));
    CHECK_IDENTICAL(clamp(g, -1.0, 1.0), clamp(x, -1.0, 1.0));  // NaN stays NaN
    Tensor l = tensor(limits).to(dtype), gl = on_gpu(l);
    CHECK_IDENTICAL(exp(gl), exp(l));  // overflow to inf, underflow to 0
    CHECK_IDENTICAL(sigmoid(gl), sigmoid(l));
    CHECK_IDENTICAL(tanh(gl), tanh(l));
    CHECK_IDENTICAL(gelu(gl), gelu(l));  // gelu(-inf) is NaN (-inf * 0) on both
    Tensor lg = tensor(logs).to(dtype);
    CHECK_IDENTICAL(log(on_gpu(lg)), log(lg));  // -inf at 0, NaN below
  }
}

TEST_CASE("unary integer ops match the CPU exactly") {
  uint64_t seed = 600;
  for (DType dtype : {DType::Int64, DType::Int32, DType::UInt8}) {
    double lo = dtype == DType::UInt8 ? 0 : -1000, hi = dtype == DType::UInt8 ? 250 : 1000;
    for (const Shape& shape : std::vector<Shape>{{1}, {7}, {1000003}, {33, 65}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(shape);
      Tensor x = values(shape, dtype, ++seed, lo, hi);
      check_unary([](const Tensor& t) { return neg(t); }, x, true, 0, 0);  // wraps for uint8
      check_unary([](const Tensor& t) { return abs(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return sign(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return relu(t); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return clamp(t, 10.0, 200.0); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return clamp(t, std::nullopt, 100.0); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return add(t, 3.0); }, x, true, 0, 0);
      check_unary([](const Tensor& t) { return mul(t, 2.0); }, x, true, 0, 0);
    }
  }
}

TEST_CASE("the kernels overwrite every element of a poisoned output (packet tails)") {
  // Sizes 1..40 cover every remainder of the 16-byte packets of float32 (4 lanes),
  // float64 (2) and uint8 (16).
  for (int64_t n = 1; n <= 40; ++n) {
    CAPTURE(n);
    for (DType dtype : {DType::Float32, DType::Float64, DType::UInt8}) {
      CAPTURE(dtype_name(dtype));
      Tensor a = values({n}, dtype, 700 + n, 0, 100), b = values({n}, dtype, 800 + n, 0, 100);
      Tensor out = test::poisoned({n}, dtype, gpu());
      binary_stub(gpu(), BinaryOp::Add, on_gpu(a), on_gpu(b), out);
      CHECK_IDENTICAL(out, add(a, b));
      Tensor scalar_b = b.select(0, 0);  // a one-element operand broadcast to every lane
      out = test::poisoned({n}, dtype, gpu());
      binary_stub(gpu(), BinaryOp::Maximum, on_gpu(a), on_gpu(scalar_b), out);
      CHECK_IDENTICAL(out, maximum(a, scalar_b));
      out = test::poisoned({n}, dtype, gpu());
      unary_stub(gpu(), UnaryOp::Relu, on_gpu(a), out, 0, 0);
      CHECK_IDENTICAL(out, relu(a));
      out = test::poisoned({n}, DType::Bool, gpu());
      binary_stub(gpu(), BinaryOp::Lt, on_gpu(a), on_gpu(b), out);
      CHECK_IDENTICAL(out, lt(a, b));
    }
    Tensor c = values({n}, DType::Bool, 900 + n, 0, 1), x = values({n}, DType::Bool, 950 + n, 0, 1);
    Tensor out = test::poisoned({n}, DType::Bool, gpu());
    where_stub(gpu(), on_gpu(c), on_gpu(x), on_gpu(c), out);  // all bool: the packet path
    CHECK_IDENTICAL(out, where(c, x, c));
  }
}

TEST_CASE("fused activation backward kernels match the CPU") {
  uint64_t seed = 1000;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double atol = atol_of(dtype), rtol = rtol_of(dtype);
    for (const Shape& shape : std::vector<Shape>{{1}, {7}, {1000003}, {33, 65}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(shape);
      Tensor g = test::random(shape, dtype, ++seed);
      Tensor x = mul(test::random(shape, dtype, ++seed), 3.0);
      for (const NamedLayout& layout : kLayouts) {
        CAPTURE(std::string(layout.name));
        Tensor gc = layout.apply(g), gg = layout.apply(on_gpu(g));
        Tensor xc = layout.apply(x), xg = layout.apply(on_gpu(x));
        CHECK_IDENTICAL(relu_backward(gg, relu(xg)), relu_backward(gc, relu(xc)));
        // The saved outputs come from the CPU so that only the backward kernel is compared.
        Tensor s = sigmoid(x), t = tanh(x);
        CHECK_GPU_MATCHES(sigmoid_backward(gg, layout.apply(on_gpu(s))), sigmoid_backward(gc, layout.apply(s)), atol,
                          rtol);
        CHECK_GPU_MATCHES(tanh_backward(gg, layout.apply(on_gpu(t))), tanh_backward(gc, layout.apply(t)), atol, rtol);
        CHECK_GPU_MATCHES(gelu_backward(gg, xg), gelu_backward(gc, xc), atol, rtol);
      }
    }
  }
}

TEST_CASE("gradients through autograd match the CPU's") {
  using Fn = std::function<Tensor(const Tensor&, const Tensor&)>;  // (x, y) -> output of x's shape
  const std::vector<std::pair<const char*, Fn>> fns = {
      {"relu", [](const Tensor& x, const Tensor&) { return relu(x); }},
      {"sigmoid", [](const Tensor& x, const Tensor&) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x, const Tensor&) { return tanh(x); }},
      {"gelu", [](const Tensor& x, const Tensor&) { return gelu(x); }},
      {"exp", [](const Tensor& x, const Tensor&) { return exp(x); }},
      {"log", [](const Tensor& x, const Tensor&) { return log(add(mul(x, x), 0.5)); }},
      {"sqrt", [](const Tensor& x, const Tensor&) { return sqrt(add(mul(x, x), 0.5)); }},
      {"abs", [](const Tensor& x, const Tensor&) { return abs(x); }},
      {"clamp", [](const Tensor& x, const Tensor&) { return clamp(x, -0.5, 0.7); }},
      {"pow", [](const Tensor& x, const Tensor&) { return pow(x, 3.0); }},
      {"mul", [](const Tensor& x, const Tensor& y) { return mul(x, y); }},
      {"div", [](const Tensor& x, const Tensor& y) { return div(x, add(mul(y, y), 1.0)); }},
      {"maximum", [](const Tensor& x, const Tensor& y) { return maximum(x, y); }},
      {"minimum", [](const Tensor& x, const Tensor& y) { return minimum(x, y); }},
      {"where", [](const Tensor& x, const Tensor& y) { return where(gt(y, 0.0), x, mul(x, y)); }},
  };
  uint64_t seed = 1100;
  for (const auto& named_fn : fns) {
    const char* name = named_fn.first;
    const Fn& fn = named_fn.second;
    CAPTURE(std::string(name));
    // y broadcasts along x's first dim, so its gradient goes through sum_to_shape.
    Tensor x = test::leaf({17, 9}, ++seed), y = test::leaf({9}, ++seed), w = test::random({17, 9}, DType::Float64, ++seed);
    Tensor xg = on_gpu(x, true), yg = on_gpu(y, true), wg = on_gpu(w);
    sum(mul(fn(x, y), w)).backward();
    sum(mul(fn(xg, yg), wg)).backward();
    REQUIRE(xg.grad().defined());
    CHECK_GPU_MATCHES(xg.grad(), x.grad(), 1e-14, 1e-12);
    if (y.grad().defined()) {
      REQUIRE(yg.grad().defined());
      CHECK_GPU_MATCHES(yg.grad(), y.grad(), 1e-14, 1e-12);
    }
  }
}

TEST_CASE("where matches the CPU: broadcasting, layouts, dtypes") {
  uint64_t seed = 1200;
  const std::vector<std::array<Shape, 3>> shapes = {
      {Shape{7}, Shape{7}, Shape{7}},
      {Shape{1000003}, Shape{1000003}, Shape{1000003}},
      {Shape{4, 1, 5}, Shape{3, 5}, Shape{}},
      {Shape{33, 65}, Shape{}, Shape{33, 65}},
      {Shape{0, 2}, Shape{2}, Shape{}},
  };
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::UInt8, DType::Bool}) {
    for (const std::array<Shape, 3>& s : shapes) {
      const Shape &sc = s[0], &sa = s[1], &sb = s[2];
      Tensor c = values(sc, DType::Bool, ++seed, 0, 1);
      Tensor a = values(sa, dtype, ++seed, 0, 100), b = values(sb, dtype, ++seed, 0, 100);
      for (const NamedLayout& layout : kLayouts) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(sc);
        CAPTURE(std::string(layout.name));
        CHECK_IDENTICAL(where(layout.apply(on_gpu(c)), layout.apply(on_gpu(a)), layout.apply(on_gpu(b))),
                        where(layout.apply(c), layout.apply(a), layout.apply(b)));
      }
    }
  }
}

TEST_CASE("in-place ops write through non-contiguous views as on the CPU") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    Tensor base = test::random({12, 10}, dtype, 1300), other = test::random({10}, dtype, 1301);
    auto run = [&](const Tensor& b, const Tensor& o) {
      Tensor view = b.clone().t();  // a transposed view of its own storage
      add_(view, o.select(0, 3));
      mul_(view, 2.0);
      relu_(view.slice(0, 0, 10, 2));
      clamp_(view, -0.5, 1.5);
      div_(view, add(o.reshape({10, 1}), 3.0));
      sub_(view, 0.25);
      return view;
    };
    CHECK_IDENTICAL(run(on_gpu(base), on_gpu(other)), run(base, other));
  }
}

TEST_CASE("more than 2^31 elements: 64-bit indexing") {
  // lt of a row against a column: a broadcast (indexed path) over 65537 * 32769 =
  // 2,147,581,953 > 2^31 - 1 bool outputs (2 GB on the GPU). Compared bytewise.
  Tensor row = values({65537}, DType::UInt8, 1400, 0, 256), col = values({32769, 1}, DType::UInt8, 1401, 0, 256);
  Tensor expected = lt(row, col);
  Tensor actual = lt(on_gpu(row), on_gpu(col)).to(kCPU);
  REQUIRE(actual.numel() > int64_t{INT32_MAX});
  REQUIRE(actual.is_contiguous());
  CHECK(std::memcmp(actual.raw_data(), expected.raw_data(), static_cast<size_t>(expected.nbytes())) == 0);
}

TEST_CASE("random fills equal the CPU's for the same generator state") {
  const uint64_t seed = 0x123456789ABCDEF0ull;
  // The last offset makes the Philox counter cross 2^32 inside the fill.
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 3}) {
    for (const Shape& shape : std::vector<Shape>{{1}, {7}, {4, 33}, {1000003}}) {
      CAPTURE(offset);
      CAPTURE(shape);
      Generator cg(seed), gg(seed);
      cg.set_offset(offset);
      gg.set_offset(offset);
      auto on = [](DType dtype) { return TensorOptions(dtype, gpu()); };
      CHECK_IDENTICAL(rand(shape, on(DType::Float32), &gg), rand(shape, DType::Float32, &cg));
      CHECK_IDENTICAL(rand(shape, on(DType::Float64), &gg), rand(shape, DType::Float64, &cg));
      CHECK_IDENTICAL(randint(-5, 17, shape, on(DType::Int64), &gg), randint(-5, 17, shape, DType::Int64, &cg));
      CHECK_IDENTICAL(randint(-5, 17, shape, on(DType::Int32), &gg), randint(-5, 17, shape, DType::Int32, &cg));
      CHECK_IDENTICAL(randint(0, 200, shape, on(DType::UInt8), &gg), randint(0, 200, shape, DType::UInt8, &cg));
      CHECK_IDENTICAL(randint(-1000, 1000, shape, on(DType::Float32), &gg),
                      randint(-1000, 1000, shape, DType::Float32, &cg));
      const int64_t wide = int64_t{1} << 40;
      CHECK_IDENTICAL(randint(-wide, wide + 7, shape, on(DType::Int64), &gg),
                      randint(-wide, wide + 7, shape, DType::Int64, &cg));
      // Normals: log and cos come from different libraries (see the file comment).
      Tensor n32 = randn(shape, on(DType::Float32), &gg), c32 = randn(shape, DType::Float32, &cg);
      CHECK(max_ulp<float>(n32, c32) <= 1);
      Tensor n64 = randn(shape, on(DType::Float64), &gg), c64 = randn(shape, DType::Float64, &cg);
      CHECK(max_ulp<double>(n64, c64) <= 8);
      // Both generators advanced by the same number of Philox blocks.
      CHECK(gg.offset() == cg.offset());
    }
  }
}

TEST_CASE("random fills: repeatable on the GPU, the default generator, empty and misaligned destinations") {
  Generator a(42), b(42);
  CHECK_IDENTICAL(randn({1001}, TensorOptions(DType::Float32, gpu()), &a),
                  randn({1001}, TensorOptions(DType::Float32, gpu()), &b));
  manual_seed(77);
  Tensor on_device = rand({1001}, TensorOptions(DType::Float64, gpu()));
  manual_seed(77);
  CHECK_IDENTICAL(on_device, rand({1001}, DType::Float64));

  Generator e(9);
  Tensor empty_fill = rand({0, 3}, TensorOptions(DType::Float32, gpu()), &e);
  CHECK(empty_fill.numel() == 0);
  CHECK(e.offset() == 0);

  // A destination that is contiguous but not aligned for the kernel's packet stores.
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::UInt8}) {
    for (RandomKind kind : {RandomKind::Uniform, RandomKind::Normal, RandomKind::Integer}) {
      if (!is_floating(dtype) && kind != RandomKind::Integer) continue;
      CAPTURE(dtype_name(dtype));
      CAPTURE(static_cast<int>(kind));
      Tensor cpu_dst = empty({101}, dtype);
      Tensor gpu_dst = misaligned(test::poisoned({101}, dtype, gpu()));
      double lo = kind == RandomKind::Integer ? 3 : 0, hi = kind == RandomKind::Integer ? 90 : 1;
      random_stub(kCPU, cpu_dst, kind, lo, hi, 5, 11);
      random_stub(gpu(), gpu_dst, kind, lo, hi, 5, 11);
      if (kind == RandomKind::Normal && dtype == DType::Float32) CHECK(max_ulp<float>(gpu_dst, cpu_dst) <= 1);
      else if (kind == RandomKind::Normal) CHECK(max_ulp<double>(gpu_dst, cpu_dst) <= 8);
      else CHECK_IDENTICAL(gpu_dst, cpu_dst);
    }
  }
}

TEST_CASE("dropout: the same generator state gives the same mask and output as the CPU") {
  uint64_t seed = 1500;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (double p : {0.1, 0.5, 0.75}) {
      for (const Shape& shape : std::vector<Shape>{{1}, {7}, {33, 65}, {1000003}}) {
        Tensor x = test::random(shape, dtype, ++seed, -2, 2);
        for (const NamedLayout& layout : kLayouts) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(p);
          CAPTURE(shape);
          CAPTURE(std::string(layout.name));
          Generator cg(seed), gg(seed);
          CHECK_IDENTICAL(dropout(layout.apply(on_gpu(x)), p, true, &gg), dropout(layout.apply(x), p, true, &cg));
          CHECK(gg.offset() == cg.offset());
        }
      }
    }
  }
}

TEST_CASE("dropout kernel: poisoned output, misaligned mask, and the mask it leaves") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{1001}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(n);
      Tensor x = test::random({n}, dtype, 1600 + n, -2, 2);
      Tensor u = test::random({n}, dtype, 1700 + n, 0, 1);
      Tensor cpu_mask = u.clone(), cpu_out = empty({n}, dtype);
      dropout_stub(kCPU, x, cpu_mask, cpu_out, 0.3);
      for (bool aligned : {true, false}) {
        CAPTURE(aligned);
        Tensor mask = aligned ? on_gpu(u).clone() : misaligned(on_gpu(u));
        Tensor out = test::poisoned({n}, dtype, gpu());
        dropout_stub(gpu(), on_gpu(x), mask, out, 0.3);
        CHECK_IDENTICAL(out, cpu_out);
        CHECK_IDENTICAL(mask, cpu_mask);
      }
    }
  }
}

TEST_CASE("dropout backward matches the CPU bit for bit") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype_name(dtype));
    Tensor x = test::random({37, 29}, dtype, 1800, -1, 1).requires_grad_();
    Tensor w = test::random({37, 29}, dtype, 1801);
    Tensor xg = on_gpu(x, true);
    Generator cg(5), gg(5);
    sum(mul(dropout(x, 0.4, true, &cg), w)).backward();
    sum(mul(dropout(xg, 0.4, true, &gg), on_gpu(w))).backward();
    REQUIRE(xg.grad().defined());
    CHECK_IDENTICAL(xg.grad(), x.grad());
  }
}
