// scaled_dot_product_attention: the fused CPU kernels against the reference composition
// (scaled_dot_product_attention_math) on odd, causal, rectangular and non-contiguous shapes,
// gradients by finite differences and for some inputs only, thread-count independence, the
// dropout path, empty shapes and every argument error.
//
// Tolerances: in float64 the two paths differ only in the order of their sums (Eigen blocks
// the products differently; the online softmax rescales), so outputs and gradients agree to
// 1e-12 of their scale (the largest |value|, at least 1). float32 runs are compared with the
// float64 reference at 2e-5 of the scale: a few float32 roundings of sums over up to 200 terms.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "test_util.h"

using namespace weft;
using test::random;

namespace {

// A call's sizes: batch dims [B, H] (or none when B == 0), queries L, keys S, head dims E, Ev.
struct Case {
  int64_t B, H, L, S, E, Ev;
  bool causal;
};

Shape shape_of(const Case& c, int64_t rows, int64_t cols) {
  if (c.B == 0) return {rows, cols};
  return {c.B, c.H, rows, cols};
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.detach().to_vector<double>()) m = std::max(m, std::fabs(x));
  return m;
}

// |actual - expected| <= tol * max(max|expected|, 1) everywhere (NaN never passes). The inputs
// are O(1), so 1 is the scale of the terms of a gradient that cancels to 0 (grad_q with one key).
#define CHECK_NORMALISED(actual, expected, tol)                                                 \
  do {                                                                                          \
    const Tensor weft_expected_ = (expected);                                                   \
    CHECK_CLOSE((actual), weft_expected_, (tol) * std::max(max_abs(weft_expected_), 1.0), 0.0); \
  } while (0)

using Attention = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, bool, double, std::optional<double>,
                             Generator*);

// The output and the gradients of sum(out * w) for leaves made from q, k, v.
struct Result {
  Tensor out, dq, dk, dv;
};

Result run(Attention f, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
           std::optional<double> scale = std::nullopt, double dropout_p = 0, Generator* gen = nullptr) {
  Tensor ql = q.detach().requires_grad_(), kl = k.detach().requires_grad_(), vl = v.detach().requires_grad_();
  Result r;
  r.out = f(ql, kl, vl, causal, dropout_p, scale, gen);
  Tensor w = random(r.out.shape(), DType::Float64, 99).to(r.out.dtype());
  sum(mul(r.out, w)).backward();
  r.dq = ql.grad();
  r.dk = kl.grad();
  r.dv = vl.grad();
  return r;
}

void check_results(const Result& actual, const Result& expected, double tol) {
  CHECK_NORMALISED(actual.out, expected.out, tol);
  CHECK_NORMALISED(actual.dq, expected.dq, tol);
  CHECK_NORMALISED(actual.dk, expected.dk, tol);
  CHECK_NORMALISED(actual.dv, expected.dv, tol);
}

const std::vector<Case> kCases = {
    {1, 1, 1, 1, 1, 1, false},      {1, 1, 1, 1, 1, 1, true},      {2, 3, 17, 17, 8, 8, true},
    {2, 2, 70, 130, 5, 9, false},   {2, 2, 70, 130, 5, 9, true},   {1, 2, 130, 70, 16, 3, true},
    {1, 2, 130, 70, 16, 3, false},  {2, 1, 64, 64, 64, 64, true},  {1, 1, 129, 129, 3, 3, true},
    {0, 0, 33, 40, 7, 6, false},    {0, 0, 40, 33, 7, 6, true},    {3, 1, 65, 200, 33, 17, true},
    {1, 1, 200, 1, 4, 5, true},     {1, 1, 1, 150, 6, 2, false},
};

}  // namespace

TEST_CASE("attention: fused matches the reference in float64, forward and backward") {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    CAPTURE(c.B);
    CAPTURE(c.H);
    CAPTURE(c.L);
    CAPTURE(c.S);
    CAPTURE(c.E);
    CAPTURE(c.Ev);
    CAPTURE(c.causal);
    Tensor q = random(shape_of(c, c.L, c.E), DType::Float64, seed++);
    Tensor k = random(shape_of(c, c.S, c.E), DType::Float64, seed++);
    Tensor v = random(shape_of(c, c.S, c.Ev), DType::Float64, seed++);
    const Result expected = run(scaled_dot_product_attention_math, q, k, v, c.causal);
    const Result fused = run(scaled_dot_product_attention, q, k, v, c.causal);
    REQUIRE(fused.out.shape() == expected.out.shape());
    check_results(fused, expected, 1e-12);
  }
}

TEST_CASE("attention: float32 paths match the float64 reference") {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    CAPTURE(c.L);
    CAPTURE(c.S);
    CAPTURE(c.E);
    CAPTURE(c.causal);
    Tensor q = random(shape_of(c, c.L, c.E), DType::Float64, seed++);
    Tensor k = random(shape_of(c, c.S, c.E), DType::Float64, seed++);
    Tensor v = random(shape_of(c, c.S, c.Ev), DType::Float64, seed++);
    const Result expected = run(scaled_dot_product_attention_math, q, k, v, c.causal);
    for (Attention f : {scaled_dot_product_attention, scaled_dot_product_attention_math}) {
      Result r = run(f, q.to(DType::Float32), k.to(DType::Float32), v.to(DType::Float32), c.causal);
      CHECK(r.out.dtype() == DType::Float32);
      check_results(r, expected, 2e-5);
    }
  }
}

TEST_CASE("attention: non-contiguous inputs, an explicit scale and large scores") {
  // q, k, v as a GPT block makes them: views [B, H, T, D] of one [B, T, 3, H, D] tensor.
  const int64_t B = 2, T = 75, H = 3, D = 12;
  Tensor qkv = random({B, T, 3, H, D}, DType::Float64, 7);
  auto part = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
  REQUIRE(!part(0).is_contiguous());
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    for (std::optional<double> scale : {std::optional<double>(), std::optional<double>(0.7)}) {
      const Result expected = run(scaled_dot_product_attention_math, part(0), part(1), part(2), causal, scale);
      const Result fused = run(scaled_dot_product_attention, part(0), part(1), part(2), causal, scale);
      check_results(fused, expected, 1e-12);
      CHECK(fused.dq.shape() == Shape{B, H, T, D});
    }
    // Scores up to about 100: the running maximum grows from tile to tile, and exp of an
    // unshifted score would overflow.
    const Result expected = run(scaled_dot_product_attention_math, part(0), part(1), part(2), causal, 8.0);
    const Result fused = run(scaled_dot_product_attention, part(0), part(1), part(2), causal, 8.0);
    check_results(fused, expected, 1e-11);
    // A key transposed into place (stride 1 along S).
    Tensor kt = part(1).transpose(-2, -1).contiguous().transpose(-2, -1);
    check_results(run(scaled_dot_product_attention, part(0), kt, part(2), causal),
                  run(scaled_dot_product_attention_math, part(0), kt, part(2), causal), 1e-12);
  }
}

TEST_CASE("attention: gradients for some inputs only, and a second backward through retained graphs") {
  Tensor q = random({2, 9, 5}), k = random({2, 11, 5}), v = random({2, 11, 3}).requires_grad_();
  Tensor w = random({2, 9, 3}, DType::Float64, 5);
  Tensor ref_v = v.detach().requires_grad_();
  sum(mul(scaled_dot_product_attention_math(q, k, ref_v, true), w)).backward();
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  sum(mul(out, w)).backward({}, /*retain_graph=*/true);
  CHECK(!q.grad().defined());
  CHECK_NORMALISED(v.grad(), ref_v.grad(), 1e-12);
  sum(mul(out, w)).backward();
  CHECK_NORMALISED(v.grad(), mul(ref_v.grad(), 2.0), 1e-12);
}

TEST_CASE("gradcheck: both paths of attention") {
  const std::vector<Case> cases = {{1, 2, 5, 6, 3, 4, false}, {1, 2, 5, 6, 3, 4, true}, {2, 1, 7, 4, 2, 3, true},
                                   {0, 0, 4, 4, 5, 2, true}};
  uint64_t seed = 200;
  for (const Case& c : cases) {
    CAPTURE(c.L);
    CAPTURE(c.S);
    CAPTURE(c.causal);
    Tensor q = test::leaf(shape_of(c, c.L, c.E), seed++);
    Tensor k = test::leaf(shape_of(c, c.S, c.E), seed++);
    Tensor v = test::leaf(shape_of(c, c.S, c.Ev), seed++);
    const bool causal = c.causal;
    CHECK_GRADCHECK(
        [causal](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal); },
        (std::vector<Tensor>{q, k, v}));
    CHECK_GRADCHECK(
        [causal](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention_math(in[0], in[1], in[2], causal);
        },
        (std::vector<Tensor>{q, k, v}));
  }
}

TEST_CASE("attention: the fused path gives the same bits on 1 and several threads") {
  const int threads = num_threads();
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    // 150 queries and 140 keys: uneven blocks, uneven task counts per thread.
    Tensor q = random({3, 1, 150, 20}, dtype, 300), k = random({3, 1, 140, 20}, dtype, 301);
    Tensor v = random({3, 1, 140, 24}, dtype, 302);
    std::vector<std::vector<double>> results[2];
    for (int i = 0; i < 2; ++i) {
      set_num_threads(i == 0 ? 1 : std::max(3, threads));
      const Result r = run(scaled_dot_product_attention, q, k, v, true);
      for (const Tensor& t : {r.out, r.dq, r.dk, r.dv}) results[i].push_back(t.to_vector<double>());
    }
    set_num_threads(threads);
    for (int i = 0; i < 4; ++i) CHECK(results[0][i] == results[1][i]);
  }
}

TEST_CASE("attention: dropout runs the reference path with the generator's masks") {
  Tensor q = random({2, 2, 9, 4}, DType::Float64, 400), k = random({2, 2, 11, 4}, DType::Float64, 401);
  Tensor v = random({2, 2, 11, 5}, DType::Float64, 402);
  Generator g1(5), g2(5);
  const Result fused = run(scaled_dot_product_attention, q, k, v, true, std::nullopt, 0.3, &g1);
  const Result math = run(scaled_dot_product_attention_math, q, k, v, true, std::nullopt, 0.3, &g2);
  check_results(fused, math, 0.0);
  // The masks did something: without dropout the output differs.
  const Result plain = run(scaled_dot_product_attention, q, k, v, true);
  CHECK(test::mismatch(fused.out, plain.out, 1e-3, 0) != "");
}

TEST_CASE("attention: empty shapes") {
  for (Attention f : {scaled_dot_product_attention, scaled_dot_product_attention_math}) {
    // No keys: zeros, as the reference's empty sum.
    Result r = run(f, random({2, 3, 4}), random({2, 0, 4}), random({2, 0, 5}), false);
    CHECK(r.out.shape() == Shape{2, 3, 5});
    CHECK(max_abs(r.out) == 0);
    CHECK(r.dq.shape() == Shape{2, 3, 4});
    CHECK(max_abs(r.dq) == 0);
    r = run(f, random({2, 0, 4}), random({2, 3, 4}), random({2, 3, 5}), true);
    CHECK(r.out.shape() == Shape{2, 0, 5});
    CHECK(max_abs(r.dk) == 0);
    CHECK(max_abs(r.dv) == 0);
    r = run(f, random({0, 2, 4}), random({0, 3, 4}), random({0, 3, 5}), false);
    CHECK(r.out.shape() == Shape{0, 2, 5});
    r = run(f, random({2, 3, 4}), random({2, 6, 4}), random({2, 6, 0}), true);
    CHECK(r.out.shape() == Shape{2, 3, 0});
    CHECK(max_abs(r.dq) == 0);
  }
}

TEST_CASE("attention: errors") {
  const Tensor q = random({2, 3, 4}), k = random({2, 5, 4}), v = random({2, 5, 6});
  auto sdpa = [](const Tensor& a, const Tensor& b, const Tensor& c, double p = 0,
                 std::optional<double> s = std::nullopt) { return scaled_dot_product_attention(a, b, c, false, p, s); };
  CHECK_THROWS_WITH_AS(sdpa(Tensor(), k, v),
                       doctest::Contains("scaled_dot_product_attention: argument 'query' is an undefined tensor"),
                       Error);
  CHECK_THROWS_WITH_AS(sdpa(random({4}), k, v),
                       doctest::Contains("expected query [..., L, E] with at least 2 dims, got shape [4]"), Error);
  CHECK_THROWS_WITH_AS(sdpa(q, random({4}), v),
                       doctest::Contains("expected key [..., S, E] with at least 2 dims, got shape [4]"), Error);
  CHECK_THROWS_WITH_AS(sdpa(q, k, random({5})),
                       doctest::Contains("expected value [..., S, Ev] with at least 2 dims, got shape [5]"), Error);
  CHECK_THROWS_WITH_AS(sdpa(q.to(DType::Int64), k.to(DType::Int64), v.to(DType::Int64)),
                       doctest::Contains("expected a float32 or float64 tensor, got int64"), Error);
  CHECK_THROWS_WITH_AS(sdpa(q, k.to(DType::Float32), v), doctest::Contains("dtype mismatch, float64 and float32"),
                       Error);
  CHECK_THROWS_WITH_AS(sdpa(q, k, v.to(Device(DeviceType::CPU, 1))),
                       doctest::Contains("expected all tensors on one device, got cpu:0 and cpu:1"), Error);
  CHECK_THROWS_WITH_AS(sdpa(q, random({3, 5, 4}), random({3, 5, 6})),
                       doctest::Contains("must have equal leading (batch, head) dims (weft does not broadcast them), "
                                         "got query [2, 3, 4], key [3, 5, 4], value [3, 5, 6]"),
                       Error);
  CHECK_THROWS_WITH_AS(sdpa(q, random({1, 2, 5, 4}), random({1, 2, 5, 6})),
                       doctest::Contains("equal leading (batch, head) dims"), Error);
  CHECK_THROWS_WITH_AS(sdpa(q, random({2, 5, 3}), v),
                       doctest::Contains("query's last dim E = 4 must equal key's, got query [2, 3, 4] and "
                                         "key [2, 5, 3]"),
                       Error);
  CHECK_THROWS_WITH_AS(sdpa(q, k, random({2, 7, 6})),
                       doctest::Contains("key and value must have the same length S (dim -2), got key [2, 5, 4] and "
                                         "value [2, 7, 6]"),
                       Error);
  CHECK_THROWS_WITH_AS(sdpa(random({2, 3, 0}), random({2, 5, 0}), v),
                       doctest::Contains("query and key have head dim E = 0"), Error);
  for (double p : {-0.1, 1.0, std::nan("")}) {
    CAPTURE(p);
    CHECK_THROWS_WITH_AS(sdpa(q, k, v, p), doctest::Contains("dropout_p must be in [0, 1), got"), Error);
  }
  for (double s : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    CAPTURE(s);
    CHECK_THROWS_WITH_AS(sdpa(q, k, v, 0, s), doctest::Contains("scale must be finite, got"), Error);
  }
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention_math(q, k, random({2, 7, 6})),
                       doctest::Contains("scaled_dot_product_attention_math: key and value must have the same length"),
                       Error);
}
