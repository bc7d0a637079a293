// matmul / mm / bmm / linear: every rank combination against a naive float64 loop,
// strided operands, float32, gradcheck, thread-count independence and error texts.
#include <algorithm>
#include <vector>

#include "test_util.h"

using namespace weft;
using test::leaf;
using test::noncontiguous;
using test::random;

namespace {

// torch.matmul's rank rules written out with plain index arithmetic over flat values.
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  std::vector<int64_t> sa = a.shape().vec(), sb = b.shape().vec();
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const size_t nb = std::max(sa.size(), sb.size()) - 2;
  std::vector<int64_t> ba(nb, 1), bb(nb, 1), batch(nb);
  std::copy(sa.begin(), sa.end() - 2, ba.end() - (sa.size() - 2));
  std::copy(sb.begin(), sb.end() - 2, bb.end() - (sb.size() - 2));
  int64_t count = 1;
  for (size_t i = 0; i < nb; ++i) count *= (batch[i] = std::max(ba[i], bb[i]));

  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  std::vector<double> out(count * m * n);
  for (int64_t bi = 0; bi < count; ++bi) {
    // Flat batch index -> the operands' batch offsets (size-1 dims repeat).
    int64_t rest = bi, ia = 0, ib = 0, step_a = 1, step_b = 1;
    for (int64_t d = static_cast<int64_t>(nb) - 1; d >= 0; --d) {
      int64_t idx = rest % batch[d];
      rest /= batch[d];
      ia += (ba[d] == 1 ? 0 : idx) * step_a;
      ib += (bb[d] == 1 ? 0 : idx) * step_b;
      step_a *= ba[d];
      step_b *= bb[d];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += va[(ia * m + i) * k + p] * vb[(ib * k + p) * n + j];
        out[(bi * m + i) * n + j] = acc;
      }
  }
  std::vector<int64_t> shape = batch;
  if (!a_vec) shape.push_back(m);
  if (!b_vec) shape.push_back(n);
  return tensor<double>(out, Shape(shape));
}

// x @ w^T + bias by the definition.
Tensor reference_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t in = w.size(1), out_f = w.size(0), rows = x.numel() / in;
  const std::vector<double> vx = x.to_vector<double>(), vw = w.to_vector<double>();
  const std::vector<double> vb = bias.defined() ? bias.to_vector<double>() : std::vector<double>(out_f, 0.0);
  std::vector<double> out(rows * out_f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out_f; ++o) {
      double acc = vb[o];
      for (int64_t i = 0; i < in; ++i) acc += vx[r * in + i] * vw[o * in + i];
      out[r * out_f + o] = acc;
    }
  Shape shape = x.shape();
  shape[shape.size() - 1] = out_f;
  return tensor<double>(out, shape);
}

struct ShapePair {
  Shape a, b;
};

const std::vector<ShapePair> kRankCases = {
    {{5}, {5}},                      // dot
    {{3, 4}, {4, 5}},                // mm
    {{4}, {4, 6}},                   // vector @ matrix
    {{3, 4}, {4}},                   // matrix @ vector
    {{2, 1, 3, 4}, {5, 4, 6}},       // broadcast batch
    {{7}, {2, 7, 3}},                // vector @ batch
    {{2, 3, 7}, {7}},                // batch @ vector
    {{3, 1, 4, 5}, {1, 2, 5, 2}},    // both broadcast
    {{4, 3, 5}, {5, 2}},             // batch @ matrix (folded into one product)
    {{3, 5}, {4, 5, 2}},             // matrix @ batch
    {{1, 1}, {1, 1}},                // 1x1
    {{9, 1}, {1, 7}},                // outer product (k = 1)
    {{1, 17}, {17, 1}},              // inner product as matrices
};

int64_t allocations() { return memory_stats(kCPU).total_allocations; }

}  // namespace

TEST_CASE("matmul: every rank combination matches a naive loop") {
  uint64_t seed = 10;
  for (const auto& c : kRankCases) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    Tensor a = random(c.a, DType::Float64, seed++), b = random(c.b, DType::Float64, seed++);
    Tensor out = matmul(a, b);
    CHECK_CLOSE(out, reference_matmul(a, b), 1e-12, 1e-12);
  }
  CHECK(matmul(random({5}), random({5}, DType::Float64, 2)).dim() == 0);
  CHECK(matmul(random({2, 1, 3, 4}), random({5, 4, 6})).shape() == Shape{2, 5, 3, 6});
}

TEST_CASE("matmul: sizes large enough to be split into parallel tasks") {
  // Row blocks, column blocks and a batch of products.
  const std::vector<ShapePair> cases = {{{300, 200}, {200, 250}}, {{40, 200}, {200, 300}}, {{8, 50, 60}, {8, 60, 70}},
                                        {{3, 70, 90}, {90, 80}}};
  uint64_t seed = 40;
  for (const auto& c : cases) {
    CAPTURE(c.a);
    Tensor a = random(c.a, DType::Float64, seed++), b = random(c.b, DType::Float64, seed++);
    CHECK_CLOSE(matmul(a, b), reference_matmul(a, b), 1e-11, 1e-11);
  }
}

TEST_CASE("matmul: transposed, strided, expanded and non-contiguous operands") {
  Tensor a = random({6, 5}, DType::Float64, 1), b = random({5, 7}, DType::Float64, 2);
  Tensor expected = reference_matmul(a, b);
  // Transposed views (column-major maps), on either side and both.
  Tensor at = random({5, 6}, DType::Float64, 3), bt = random({7, 5}, DType::Float64, 4);
  CHECK_CLOSE(matmul(at.t(), b), reference_matmul(at.t().contiguous(), b), 1e-12, 1e-12);
  CHECK_CLOSE(matmul(a, bt.t()), reference_matmul(a, bt.t().contiguous()), 1e-12, 1e-12);
  CHECK_CLOSE(matmul(at.t(), bt.t()), reference_matmul(at.t().contiguous(), bt.t().contiguous()), 1e-12, 1e-12);
  CHECK_CLOSE(matmul(noncontiguous(a), noncontiguous(b)), expected, 1e-12, 1e-12);
  // Neither dim with unit stride: the kernel must copy.
  Tensor big = random({12, 10}, DType::Float64, 5);
  Tensor strided = big.slice(0, 0, 12, 2).slice(1, 0, 10, 2);  // [6, 5], strides (20, 2)
  CHECK_CLOSE(matmul(strided, b), reference_matmul(strided.contiguous(), b), 1e-12, 1e-12);
  // Row padding (leading dimension > cols) from a narrowed view.
  Tensor wide = random({6, 9}, DType::Float64, 6).narrow(1, 2, 5);
  CHECK_CLOSE(matmul(wide, b), reference_matmul(wide.contiguous(), b), 1e-12, 1e-12);
  // Stride-0 rows: an expanded vector.
  Tensor rows = random({1, 5}, DType::Float64, 7).expand({6, 5});
  CHECK_CLOSE(matmul(rows, b), reference_matmul(rows.contiguous(), b), 1e-12, 1e-12);
  // 1-d operands with stride 2.
  Tensor v = noncontiguous(random({5}, DType::Float64, 8));
  CHECK_CLOSE(matmul(v, b), reference_matmul(v.contiguous(), b), 1e-12, 1e-12);
  CHECK_CLOSE(matmul(a, v), reference_matmul(a, v.contiguous()), 1e-12, 1e-12);
  CHECK_CLOSE(matmul(v, v), reference_matmul(v.contiguous(), v.contiguous()), 1e-12, 1e-12);
  // Batched operands whose matrices are transposed, and a permuted batch (not foldable).
  Tensor ba = random({3, 5, 4}, DType::Float64, 9).transpose(1, 2);  // [3, 4, 5]
  Tensor bb = random({3, 5, 2}, DType::Float64, 10);
  CHECK_CLOSE(matmul(ba, bb), reference_matmul(ba.contiguous(), bb), 1e-12, 1e-12);
  Tensor permuted = random({4, 3, 5}, DType::Float64, 11).transpose(0, 1);  // [3, 4, 5]
  CHECK_CLOSE(matmul(permuted, b), reference_matmul(permuted.contiguous(), b), 1e-12, 1e-12);
  Tensor expanded_batch = random({1, 4, 5}, DType::Float64, 12).expand({3, 4, 5});
  CHECK_CLOSE(matmul(expanded_batch, bb), reference_matmul(expanded_batch.contiguous(), bb), 1e-12, 1e-12);
}

TEST_CASE("matmul: a transposed view is read in place, not copied") {
  Tensor a = random({6, 5}, DType::Float64, 1), bt = random({7, 5}, DType::Float64, 2);
  int64_t before = allocations();
  Tensor out = matmul(a, bt.t());
  CHECK(allocations() - before == 1);  // the output only
  Tensor x = random({4, 3, 5}, DType::Float64, 3), w = random({7, 5}, DType::Float64, 4);
  Tensor bias = random({7}, DType::Float64, 5);
  before = allocations();
  Tensor y = linear(x, w, bias);
  CHECK(allocations() - before == 1);
  CHECK_CLOSE(y, reference_linear(x, w, bias), 1e-12, 1e-12);
}

TEST_CASE("matmul: float32 within a tolerance that scales with k") {
  uint64_t seed = 60;
  for (const auto& c : kRankCases) {
    CAPTURE(c.a);
    Tensor a = random(c.a, DType::Float32, seed++), b = random(c.b, DType::Float32, seed++);
    Tensor out = matmul(a, b);
    CHECK(out.dtype() == DType::Float32);
    CHECK_CLOSE(out, reference_matmul(a, b), 1e-5, 1e-5);
  }
  Tensor a = random({130, 300}, DType::Float32, 70), b = random({300, 90}, DType::Float32, 71);
  CHECK_CLOSE(matmul(a, b), reference_matmul(a, b), 3e-4, 1e-4);
  CHECK_CLOSE(matmul(a.t().contiguous().t(), b), reference_matmul(a, b), 3e-4, 1e-4);
}

TEST_CASE("matmul: empty dims") {
  Tensor out = matmul(random({3, 0}), random({0, 4}, DType::Float64, 2));
  CHECK(out.shape() == Shape{3, 4});
  CHECK(out.to_vector<double>() == std::vector<double>(12, 0.0));
  CHECK(matmul(random({0, 3}), random({3, 4})).shape() == Shape{0, 4});
  CHECK(matmul(random({2, 0, 3}), random({3, 4})).shape() == Shape{2, 0, 4});
  CHECK(matmul(random({0}), random({0})).item() == 0.0);
  // Gradients of empty products have the operands' shapes (zeros where k == 0).
  Tensor a = leaf({2, 3, 0}, 1), b = leaf({0, 4}, 2);
  sum(matmul(a, b)).backward();
  CHECK(a.grad().shape() == Shape{2, 3, 0});
  CHECK(b.grad().shape() == Shape{0, 4});
  Tensor c = leaf({2, 0, 3}, 3), d = leaf({3, 4}, 4);
  sum(matmul(c, d)).backward();
  CHECK(c.grad().shape() == Shape{2, 0, 3});
  CHECK(d.grad().to_vector<double>() == std::vector<double>(12, 0.0));
}

TEST_CASE("mm and bmm") {
  Tensor a = random({4, 6}, DType::Float64, 1), b = random({6, 3}, DType::Float64, 2);
  CHECK_CLOSE(mm(a, b), reference_matmul(a, b), 1e-12, 1e-12);
  Tensor ba = random({3, 4, 6}, DType::Float64, 3), bb = random({3, 6, 2}, DType::Float64, 4);
  CHECK_CLOSE(bmm(ba, bb), reference_matmul(ba, bb), 1e-12, 1e-12);
}

TEST_CASE("matmul: the result does not depend on the thread count") {
  Tensor a = random({257, 300}, DType::Float32, 1), b = random({300, 129}, DType::Float32, 2);
  Tensor ba = random({6, 40, 70}, DType::Float32, 3), bb = random({6, 70, 33}, DType::Float32, 4);
  const int threads = num_threads();
  set_num_threads(1);
  std::vector<float> one = matmul(a, b).to_vector<float>(), one_b = matmul(ba, bb).to_vector<float>();
  set_num_threads(2);
  std::vector<float> two = matmul(a, b).to_vector<float>(), two_b = matmul(ba, bb).to_vector<float>();
  set_num_threads(threads);
  CHECK(one == two);
  CHECK(one_b == two_b);
}

TEST_CASE("matmul: gradcheck in every rank combination") {
  uint64_t seed = 100;
  for (const auto& c : kRankCases) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    Tensor a = leaf(c.a, seed++), b = leaf(c.b, seed++);
    CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, (std::vector<Tensor>{a, b}));
    // One side only: the other gets no gradient and must not be needed.
    Tensor fixed = random(c.b, DType::Float64, seed++);
    CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                    (std::vector<Tensor>{a, fixed}));
  }
}

TEST_CASE("matmul: gradcheck with transposed and non-contiguous operands") {
  Tensor a = leaf({5, 3}, 1), b = leaf({4, 5}, 2);
  // a^T [3, 5] @ b^T [5, 4], both read as column-major views.
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return matmul(in[0].t(), in[1].t()); },
                  (std::vector<Tensor>{a, b}));
  Tensor ba = leaf({2, 4, 3}, 3), bb = leaf({4, 2}, 4);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return matmul(in[0].transpose(1, 2), in[1]); },
                  (std::vector<Tensor>{ba, bb}));
  Tensor big = leaf({6, 8}, 5), v = leaf({4}, 6);
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& in) { return matmul(in[0].slice(0, 0, 6, 2).slice(1, 0, 8, 2), in[1]); },
      (std::vector<Tensor>{big, v}));
  Tensor ma = leaf({3, 4}, 7), mb = leaf({2, 4, 3}, 8);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return mm(in[0], in[1].select(0, 1)); },
                  (std::vector<Tensor>{ma, mb}));
  Tensor xa = leaf({2, 3, 4}, 9), xb = leaf({2, 4, 2}, 10);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); }, (std::vector<Tensor>{xa, xb}));
}

TEST_CASE("linear: forward against the definition") {
  Tensor w = random({5, 4}, DType::Float64, 1), bias = random({5}, DType::Float64, 2);
  for (const Shape& shape : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}, Shape{1, 4}, Shape{0, 4}}) {
    CAPTURE(shape);
    Tensor x = random(shape, DType::Float64, 3);
    CHECK_CLOSE(linear(x, w, bias), reference_linear(x, w, bias), 1e-12, 1e-12);
    CHECK_CLOSE(linear(x, w), reference_linear(x, w, Tensor()), 1e-12, 1e-12);
  }
  // Strided input (leading dims do not merge), transposed input and weight.
  Tensor x = random({3, 2, 4}, DType::Float64, 4).transpose(0, 1);
  CHECK_CLOSE(linear(x, w, bias), reference_linear(x.contiguous(), w, bias), 1e-12, 1e-12);
  Tensor xt = random({4, 6}, DType::Float64, 5).t(), wt = random({4, 5}, DType::Float64, 6).t();
  CHECK_CLOSE(linear(xt, wt, bias), reference_linear(xt.contiguous(), wt.contiguous(), bias), 1e-12, 1e-12);
  // float32, and in_features == 0 (bias only).
  Tensor x32 = random({7, 40}, DType::Float32, 7), w32 = random({9, 40}, DType::Float32, 8);
  Tensor b32 = random({9}, DType::Float32, 9);
  CHECK_CLOSE(linear(x32, w32, b32), reference_linear(x32, w32, b32), 1e-5, 1e-5);
  Tensor empty_in = linear(random({3, 0}), random({2, 0}), bias.narrow(0, 0, 2));
  CHECK_CLOSE(empty_in, bias.narrow(0, 0, 2).unsqueeze(0).expand({3, 2}).contiguous(), 0, 0);
}

TEST_CASE("linear: gradcheck with and without bias") {
  Tensor w = leaf({3, 4}, 1), bias = leaf({3}, 2);
  for (const Shape& shape : {Shape{4}, Shape{2, 4}, Shape{2, 3, 4}}) {
    CAPTURE(shape);
    Tensor x = leaf(shape, 3);
    CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                    (std::vector<Tensor>{x, w, bias}));
    CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, (std::vector<Tensor>{x, w}));
  }
  // Bias only, weight only, and a non-contiguous input.
  Tensor x = leaf({2, 4}, 4);
  Tensor fixed_x = random({2, 4}, DType::Float64, 5), fixed_w = random({3, 4}, DType::Float64, 6);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                  (std::vector<Tensor>{fixed_x, fixed_w, bias}));
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
                  (std::vector<Tensor>{fixed_x, w}));
  Tensor xt = leaf({4, 3, 2}, 7);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0].transpose(0, 2), in[1], in[2]); },
                  (std::vector<Tensor>{xt, w, bias}));
}

TEST_CASE("linear: a bias-free layer leaves the bias gradient alone") {
  Tensor x = leaf({2, 4}, 1), w = leaf({3, 4}, 2);
  sum(linear(x, w)).backward();
  REQUIRE(w.grad().defined());
  // d sum(x W^T) / dW[o, i] = sum over rows of x[:, i].
  std::vector<double> xs = x.to_vector<double>(), gw = w.grad().to_vector<double>();
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 4; ++i) CHECK(gw[o * 4 + i] == doctest::Approx(xs[i] + xs[4 + i]));
}

TEST_CASE("matmul family: shape, dtype and device errors") {
  Tensor a = random({2, 3}), b = random({4, 5});
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)"),
                       Error);
  CHECK_THROWS_WITH_AS(matmul(random({3}), random({4})),
                       doctest::Contains("matmul: shapes [3] and [4] cannot be multiplied (3 != 4)"), Error);
  CHECK_THROWS_WITH_AS(matmul(random({2, 3}), random({2})), doctest::Contains("cannot be multiplied (3 != 2)"), Error);
  CHECK_THROWS_WITH_AS(matmul(scalar_tensor(1.0, DType::Float64), random({2})),
                       doctest::Contains("matmul: both arguments need at least 1 dimension"), Error);
  CHECK_THROWS_WITH_AS(matmul(random({2, 3, 4}), random({5, 4, 2})),
                       doctest::Contains("matmul: the batch dims of shapes [2, 3, 4] and [5, 4, 2] cannot be broadcast"),
                       Error);
  CHECK_THROWS_WITH_AS(matmul(random({2, 3}, DType::Float32), random({3, 2}, DType::Float64)),
                       doctest::Contains("matmul: dtype mismatch, float32 and float64"), Error);
  Tensor ia = arange(6).view({2, 3}), ib = arange(6).view({3, 2});
  CHECK_THROWS_WITH_AS(matmul(ia, ib), doctest::Contains("matmul: expected a float32 or float64 tensor, got int64"),
                       Error);
  CHECK_THROWS_WITH_AS(matmul(random({2, 3}), random({3, 2}).to(Device("cpu:1"))),
                       doctest::Contains("matmul: expected all tensors on one device"), Error);
  CHECK_THROWS_WITH_AS(matmul(Tensor(), random({3})), doctest::Contains("undefined tensor"), Error);

  CHECK_THROWS_WITH_AS(mm(random({2, 3, 4}), random({4, 2})), doctest::Contains("mm: expected 'a' to have 2 dimensions"),
                       Error);
  CHECK_THROWS_WITH_AS(mm(random({2, 3}), random({4, 2})), doctest::Contains("mm: shapes [2, 3] and [4, 2] cannot be"),
                       Error);
  CHECK_THROWS_WITH_AS(bmm(random({2, 3, 4}), random({3, 4, 2})), doctest::Contains("bmm: batch sizes differ"), Error);
  CHECK_THROWS_WITH_AS(bmm(random({3, 4}), random({3, 4, 2})), doctest::Contains("bmm: expected 'a' to have 3 dimensions"),
                       Error);

  Tensor w = random({5, 4});
  CHECK_THROWS_WITH_AS(linear(random({2, 3}), w),
                       doctest::Contains("linear: input shape [2, 3] and weight shape [5, 4] do not match"), Error);
  CHECK_THROWS_WITH_AS(linear(random({2, 4}), random({4})), doctest::Contains("linear: expected 'weight' to have 2"),
                       Error);
  CHECK_THROWS_WITH_AS(linear(random({2, 4}), w, random({4})),
                       doctest::Contains("linear: expected bias of shape [5] for weight shape [5, 4], got [4]"), Error);
  CHECK_THROWS_WITH_AS(linear(random({2, 4}), w, random({5}, DType::Float32)),
                       doctest::Contains("linear: dtype mismatch"), Error);
  CHECK_THROWS_WITH_AS(linear(random({2, 4}).to(Device("cpu:1")), w),
                       doctest::Contains("linear: expected all tensors on one device"), Error);
}
