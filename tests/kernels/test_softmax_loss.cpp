// softmax / log_softmax and the losses: forward against naive float64 loops, stability,
// gradients by finite differences, PyTorch's reduction and weighting rules, error texts.
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/cpu/softmax_rows.h"
#include "test_util.h"

using namespace weft;

namespace {

// x read as [outer, n, post] around `dim`, as plain index arithmetic.
struct Around {
  int64_t outer = 1, n = 1, post = 1;
  Around(const Shape& s, int64_t dim) {
    if (s.empty()) return;
    if (dim < 0) dim += s.size();
    for (int64_t d = 0; d < dim; ++d) outer *= s[d];
    n = s[dim];
    for (int64_t d = dim + 1; d < s.size(); ++d) post *= s[d];
  }
  int64_t at(int64_t o, int64_t i, int64_t p) const { return (o * n + i) * post + p; }
};

Tensor naive_softmax(const Tensor& x, int64_t dim, bool log) {
  std::vector<double> v = x.to_vector<double>(), out(v.size());
  Around a(x.shape(), dim);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t p = 0; p < a.post; ++p) {
      double m = -INFINITY, s = 0;
      for (int64_t i = 0; i < a.n; ++i) m = std::max(m, v[a.at(o, i, p)]);
      for (int64_t i = 0; i < a.n; ++i) s += std::exp(v[a.at(o, i, p)] - m);
      for (int64_t i = 0; i < a.n; ++i) {
        double shifted = v[a.at(o, i, p)] - m;
        out[a.at(o, i, p)] = log ? shifted - std::log(s) : std::exp(shifted) / s;
      }
    }
  return tensor(out, x.shape());
}

// PyTorch's cross_entropy / nll_loss, written from the definitions: per position
// sum_c q_c * (-log_probs_c) with q = (1 - ls) * w_t * onehot(t) + (ls / C) * w, zero
// where ignored; Mean divides by the sum of w_t over positions not ignored.
Tensor naive_class_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index,
                        const Tensor& weight, double ls) {
  std::vector<double> lp = log_probs.to_vector<double>();
  std::vector<int64_t> t = target.to_vector<int64_t>();
  Around a(log_probs.shape(), log_probs.dim() == 1 ? 0 : 1);
  int64_t c = a.n;
  std::vector<double> w = weight.defined() ? weight.to_vector<double>() : std::vector<double>(c, 1.0);
  std::vector<double> loss;
  double total = 0, weight_sum = 0;
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t p = 0; p < a.post; ++p) {
      int64_t tt = t[o * a.post + p];
      double l = 0;
      if (tt != ignore_index) {
        for (int64_t k = 0; k < c; ++k) {
          double q = (ls / c) * w[k] + (k == tt ? (1 - ls) * w[tt] : 0.0);
          l -= q * lp[a.at(o, k, p)];
        }
        weight_sum += w[tt];
      }
      loss.push_back(l);
      total += l;
    }
  if (reduction == Reduction::None) return tensor(loss, target.shape());
  return scalar_tensor(reduction == Reduction::Sum ? total : total / weight_sum, DType::Float64);
}

// Random class indices in [0, c), with every third position set to `ignored` if given.
Tensor random_targets(const Shape& shape, int64_t c, uint64_t seed, std::optional<int64_t> ignored = {}) {
  std::vector<double> u = test::random(shape, DType::Float64, seed, 0, static_cast<double>(c)).to_vector<double>();
  std::vector<int64_t> t;
  for (size_t i = 0; i < u.size(); ++i) t.push_back(ignored && i % 3 == 1 ? *ignored : static_cast<int64_t>(u[i]));
  return tensor(t, shape);
}

const Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

}  // namespace

// --- softmax ------------------------------------------------------------------------------

TEST_CASE("softmax and log_softmax match a naive float64 loop along every dim") {
  // [2, 7, 150] along dim 1 walks 150 positions side by side: two full blocks of 64
  // columns and a partial one; along dim 2 its rows have a tail after the 8 lanes.
  for (Shape shape : {Shape{3, 4, 5}, Shape{2, 7, 150}, Shape{1, 1, 9}}) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      double tol = dtype == DType::Float32 ? 2e-6 : 1e-13;
      Tensor x = mul(test::random(shape, dtype, 41), 3.0);
      for (int64_t dim : {0, 1, 2, -1, -2}) {
        for (bool contiguous : {true, false}) {
          CAPTURE(shape);
          CAPTURE(dtype);
          CAPTURE(dim);
          Tensor in = contiguous ? x : test::noncontiguous(x);
          Tensor s = softmax(in, dim), ls = log_softmax(in, dim);
          CHECK(s.dtype() == dtype);
          CHECK_CLOSE(s, naive_softmax(x, dim, false), tol, tol);
          CHECK_CLOSE(ls, naive_softmax(x, dim, true), tol, tol);
        }
      }
    }
  }
}

TEST_CASE("the CPU float exp is within 2 ulp of the exact value") {
  // A sweep of 2e6 values over the whole range where the result is neither 0 nor inf,
  // plus the edges, in float64 arithmetic.
  auto check = [](float x) {
    double exact = std::exp(static_cast<double>(x));
    float got = cpu::exp_float(x);
    float nearest = static_cast<float>(exact);
    if (std::isinf(nearest)) return std::isinf(got);
    double ulp = std::nextafter(nearest, std::numeric_limits<float>::infinity()) - nearest;
    return std::fabs(got - exact) <= 2 * ulp;
  };
  int64_t bad = 0;
  for (int i = 0; i <= 2000000; ++i) bad += !check(-104.0f + 193.0f * static_cast<float>(i) / 2000000);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.7f, 88.72f, -87.3f, -87.4f, -100.0f, -103.9f, 1.0f, -1.0f})
    bad += !check(x);
  CHECK(bad == 0);
  float inf = std::numeric_limits<float>::infinity();
  CHECK(cpu::exp_float(inf) == inf);
  CHECK(cpu::exp_float(89.0f) == inf);
  CHECK(cpu::exp_float(-inf) == 0.0f);
  CHECK(cpu::exp_float(-1000.0f) == 0.0f);
  CHECK(std::isnan(cpu::exp_float(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("softmax is stable for large inputs") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    Tensor x = tensor(std::vector<double>{1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}).to(dtype);
    Tensor s = softmax(x, 1), ls = log_softmax(x, 1);
    Tensor expected = naive_softmax(tensor(std::vector<double>{0, 1, 2, 2, 1, 0}, {2, 3}), 1, false);
    CHECK_CLOSE(s, expected, 1e-6, 1e-6);
    CHECK_CLOSE(ls, naive_softmax(tensor(std::vector<double>{0, 1, 2, 2, 1, 0}, {2, 3}), 1, true), 1e-5, 1e-6);
    // Along dim 0 the pairs are (1000, -1000): all the mass on the first.
    CHECK_CLOSE(softmax(x, 0), tensor(std::vector<double>{1, 1, 1, 0, 0, 0}, {2, 3}), 1e-12, 0);
    CHECK_CLOSE(log_softmax(x, 0).select(0, 1), tensor(std::vector<double>{-2000, -2002, -2004}), 0, 1e-6);
  }
}

TEST_CASE("softmax edge cases: 0-d, a size-1 dim, empty tensors, NaN") {
  CHECK(softmax(scalar_tensor(3.0), 0).item() == 1.0);
  CHECK(log_softmax(scalar_tensor(3.0), -1).item() == 0.0);
  CHECK(softmax(test::random({4, 1}, DType::Float32, 42), 1).to_vector<float>() == std::vector<float>(4, 1.0f));
  CHECK(softmax(zeros({0, 3}), 1).shape() == Shape{0, 3});
  CHECK(log_softmax(zeros({2, 0}), 1).shape() == Shape{2, 0});
  float nan = std::numeric_limits<float>::quiet_NaN();
  auto row = softmax(tensor({1, nan, 2, 3, 4, 5}, {2, 3}), 1).to_vector<float>();
  CHECK((std::isnan(row[0]) && std::isnan(row[1]) && std::isnan(row[2])));
  CHECK(row[3] == doctest::Approx(0.09003057));
}

TEST_CASE("gradcheck: softmax and log_softmax along dims 0, 1 and -1") {
  Tensor x = test::leaf({3, 4, 5}, 43);
  Tensor xn = test::noncontiguous(x).requires_grad_();
  for (int64_t dim : {0, 1, -1}) {
    CAPTURE(dim);
    for (const Tensor& input : {x, xn}) {
      CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {input});
      CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {input});
    }
  }
  // More positions than one block of 64 columns (post = 66 along dim 1).
  Tensor wide = test::leaf({2, 2, 66}, 44);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {wide});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {wide});
}

// float32 runs its own code (the vectorised exp); its gradients must match float64's,
// which gradcheck has validated.
Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x64, DType dtype) {
  Tensor x = x64.to(dtype).detach().requires_grad_();
  Tensor out = f(x);
  out.backward(test::random(out.shape(), DType::Float64, 45).to(dtype));
  return x.grad();
}

TEST_CASE("float32 gradients of softmax, log_softmax and cross_entropy match float64") {
  Tensor x = mul(test::random({6, 70, 3}, DType::Float64, 46), 3.0);
  Tensor t = random_targets({6, 3}, 70, 47, int64_t{5});
  Tensor w = test::random({70}, DType::Float64, 48, 0.5, 2.0);
  std::vector<std::function<Tensor(const Tensor&)>> fns = {
      [](const Tensor& v) { return softmax(v, 1); },
      [](const Tensor& v) { return log_softmax(v, 1); },
      [](const Tensor& v) { return softmax(v.transpose(1, 2), -1); },
      [](const Tensor& v) { return log_softmax(v.transpose(1, 2), -1); },
      [&](const Tensor& v) { return cross_entropy(v, t, Reduction::None, 5, w.to(v.dtype()), 0.2); },
      [&](const Tensor& v) {
        return cross_entropy(v.transpose(1, 2).reshape({18, 70}), t.reshape({18}), Reduction::Sum, 5, Tensor(), 0.1);
      },
  };
  for (size_t i = 0; i < fns.size(); ++i) {
    CAPTURE(i);
    CHECK_CLOSE(grad_of(fns[i], x, DType::Float32), grad_of(fns[i], x, DType::Float64), 1e-6, 1e-5);
  }
}

TEST_CASE("softmax errors") {
  Tensor i = ones({2, 3}, DType::Int64);
  CHECK_THROWS_WITH_AS(softmax(i, 1), doctest::Contains("softmax: expected a float32 or float64 tensor, got int64"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(log_softmax(ones({2, 3}), 2), doctest::Contains("log_softmax: dim 2 is out of range"),
                       weft::Error);
  Tensor y = softmax(ones({2, 3}), 1);
  CHECK_THROWS_WITH_AS(softmax_backward(ones({3, 2}), y, 1),
                       doctest::Contains("softmax_backward: grad shape [3, 2] does not match output shape [2, 3]"),
                       weft::Error);
  Tensor g = ones({2, 3}).requires_grad_();
  CHECK_THROWS_WITH_AS(log_softmax_backward(g, y, 1), doctest::Contains("records no gradient of its own"),
                       weft::Error);
}

// --- nll_loss and cross_entropy -----------------------------------------------------------

TEST_CASE("nll_loss matches the definition: reductions, ignore_index, weights, 1-d to 4-d") {
  struct Layout {
    Shape input, target;
  };
  for (Layout l : {Layout{{6, 5}, {6}}, Layout{{3, 4, 7}, {3, 7}}, Layout{{2, 3, 4, 5}, {2, 4, 5}}, Layout{{5}, {}}}) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      double tol = dtype == DType::Float32 ? 2e-6 : 1e-13;
      int64_t class_dim = l.input.size() == 1 ? 0 : 1;
      int64_t c = l.input[class_dim];
      Tensor lp = log_softmax(test::random(l.input, dtype, 51), class_dim);
      Tensor w = test::random({c}, dtype, 52, 0.5, 2.0);
      for (Reduction r : kReductions)
        for (bool weighted : {false, true})
          for (int64_t ignore : {int64_t{-100}, int64_t{1}}) {
            CAPTURE(l.input);
            CAPTURE(dtype);
            CAPTURE(static_cast<int>(r));
            CAPTURE(weighted);
            CAPTURE(ignore);
            Tensor t = random_targets(l.target, c, 53, l.target.empty() ? std::nullopt : std::optional(ignore));
            Tensor wt = weighted ? w : Tensor();
            Tensor out = nll_loss(lp, t, r, ignore, wt);
            CHECK(out.shape() == (r == Reduction::None ? l.target : Shape{}));
            CHECK_CLOSE(out, naive_class_loss(lp, t, r, ignore, wt, 0.0), tol, tol);
            Tensor ce = cross_entropy(test::noncontiguous(lp), t, r, ignore, wt);
            // log_softmax is idempotent, so cross_entropy of log-probabilities is nll_loss.
            CHECK_CLOSE(ce, naive_class_loss(lp, t, r, ignore, wt, 0.0), tol * 10, tol * 10);
          }
    }
  }
}

TEST_CASE("cross_entropy with label smoothing matches PyTorch's formula") {
  Tensor logits = mul(test::random({2, 4, 3, 2}, DType::Float64, 61), 2.0);
  Tensor t = random_targets({2, 3, 2}, 4, 62, int64_t{-100});
  Tensor w = test::random({4}, DType::Float64, 63, 0.5, 2.0);
  Tensor lp = log_softmax(logits, 1);
  for (double ls : {0.0, 0.1, 1.0})
    for (Reduction r : kReductions)
      for (bool weighted : {false, true}) {
        CAPTURE(ls);
        CAPTURE(static_cast<int>(r));
        CAPTURE(weighted);
        Tensor wt = weighted ? w : Tensor();
        CHECK_CLOSE(cross_entropy(logits, t, r, -100, wt, ls), naive_class_loss(lp, t, r, -100, wt, ls), 1e-12,
                    1e-12);
      }
  // A hand-computed case: logits [0, ln 3] (softmax 1/4, 3/4), target 1, ls 0.2, C 2:
  // 0.8 * -ln(3/4) + 0.1 * (-ln(1/4) - ln(3/4)).
  Tensor two = tensor(std::vector<double>{0, std::log(3.0)}, {1, 2});
  double expected = 0.8 * -std::log(0.75) + 0.1 * (-std::log(0.25) - std::log(0.75));
  CHECK(cross_entropy(two, tensor(std::vector<int64_t>{1}), Reduction::Mean, -100, Tensor(), 0.2).item() ==
        doctest::Approx(expected).epsilon(1e-14));
}

TEST_CASE("cross_entropy: float32 is accurate and stable for large logits") {
  Tensor logits32 = add(mul(test::random({64, 10}, DType::Float32, 64), 4.0), 500.0);
  Tensor t = random_targets({64}, 10, 65);
  Tensor logits64 = logits32.to(DType::Float64);
  for (Reduction r : kReductions) {
    Tensor ref = naive_class_loss(log_softmax(logits64, 1), t, r, -100, Tensor(), 0.0);
    Tensor out32 = cross_entropy(logits32, t, r);
    CHECK(out32.dtype() == DType::Float32);
    CHECK_CLOSE(out32, ref, 1e-6, 1e-6);
  }
  Tensor big = tensor({1000, -1000, 0}, {1, 3});
  CHECK(cross_entropy(big, tensor(std::vector<int64_t>{0})).item() == 0.0);
  CHECK(cross_entropy(big, tensor(std::vector<int64_t>{2})).item() == doctest::Approx(1000.0));
}

TEST_CASE("class losses: every target ignored gives NaN for Mean, 0 for Sum") {
  Tensor lp = log_softmax(test::random({3, 4}, DType::Float64, 66), 1);
  Tensor t = tensor(std::vector<int64_t>{-100, -100, -100});
  CHECK(std::isnan(nll_loss(lp, t).item()));
  CHECK(std::isnan(cross_entropy(lp, t).item()));
  CHECK(nll_loss(lp, t, Reduction::Sum).item() == 0.0);
  CHECK(cross_entropy(lp, t, Reduction::None).to_vector<double>() == std::vector<double>{0, 0, 0});
}

TEST_CASE("gradcheck: nll_loss and cross_entropy, every reduction and option") {
  struct Layout {
    Shape input, target;
  };
  for (Layout l : {Layout{{4, 3}, {4}}, Layout{{2, 3, 2, 2}, {2, 2, 2}}, Layout{{3}, {}}}) {
    int64_t class_dim = l.input.size() == 1 ? 0 : 1;
    int64_t c = l.input[class_dim];
    Tensor x = test::leaf(l.input, 71);
    Tensor xn = test::noncontiguous(x).requires_grad_();
    Tensor w = test::random({c}, DType::Float64, 72, 0.5, 2.0);
    Tensor t = random_targets(l.target, c, 73);
    // Class 0 ignored (a 0-d target keeps -100: ignoring its only position gives NaN).
    int64_t ignore = l.target.empty() ? -100 : 0;
    Tensor t_ignored = l.target.empty() ? t : random_targets(l.target, c, 74, int64_t{0});
    for (Reduction r : kReductions) {
      CAPTURE(l.input);
      CAPTURE(static_cast<int>(r));
      for (const Tensor& input : {x, xn}) {
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return nll_loss(in[0], t, r); }, {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return nll_loss(in[0], t_ignored, r, ignore, w); }, {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, r); }, {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t_ignored, r, ignore, w); },
                        {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t_ignored, r, ignore, w, 0.3); },
                        {input});
      }
    }
  }
}

TEST_CASE("cross_entropy backward equals the gradient of log_softmax + nll_loss") {
  Tensor x = mul(test::random({16, 11}, DType::Float32, 75), 3.0).requires_grad_();
  Tensor t = random_targets({16}, 11, 76, int64_t{3});
  Tensor w = test::random({11}, DType::Float32, 77, 0.5, 2.0);
  Tensor y = x.detach().clone().requires_grad_();
  cross_entropy(x, t, Reduction::Mean, 3, w).backward();
  nll_loss(log_softmax(y, 1), t, Reduction::Mean, 3, w).backward();
  CHECK_CLOSE(x.grad(), y.grad(), 1e-7, 1e-5);
}

TEST_CASE("class loss errors: target dtype, shapes, out-of-range targets, weight, device") {
  Tensor x = test::random({4, 3}, DType::Float32, 81);
  Tensor t = tensor(std::vector<int64_t>{0, 2, 1, 0});
  CHECK_THROWS_WITH_AS(cross_entropy(x, t.to(DType::Float32)),
                       doctest::Contains("cross_entropy: expected 'target' to hold class indices of dtype int64, got float32"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(nll_loss(x, t.to(DType::Int32)),
                       doctest::Contains("nll_loss: expected 'target' to hold class indices of dtype int64, got int32"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, tensor(std::vector<int64_t>{0, 1, 2})),
                       doctest::Contains("cross_entropy: target shape [3] does not match logits shape [4, 3] "
                                         "(expected target shape [4]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(nll_loss(zeros({2, 3, 5}), zeros({2, 4}, DType::Int64)),
                       doctest::Contains("expected target shape [2, 5]"), weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, tensor(std::vector<int64_t>{0, 2, 3, 0})),
                       doctest::Contains("cross_entropy: target value 3 at position [2] is out of range for 3 classes "
                                         "(expected 0 .. 2, or ignore_index -100)"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(nll_loss(zeros({2, 3, 2}), tensor(std::vector<int64_t>{0, 1, -1, 2}, {2, 2})),
                       doctest::Contains("nll_loss: target value -1 at position [1, 0] is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, t, Reduction::Mean, -100, ones({4})),
                       doctest::Contains("expected 'weight' of shape [3] (one weight per class), got [4]"), weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, t, Reduction::Mean, -100, ones({3}, DType::Float64)),
                       doctest::Contains("'weight' has dtype float64 but 'logits' has float32"), weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, t, Reduction::Mean, -100, ones({3}).requires_grad_()),
                       doctest::Contains("class weights are not differentiable"), weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, t.to(Device("cpu:1"))), doctest::Contains("cpu:1"), weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x.to(DType::Int64), t), doctest::Contains("expected a float32 or float64 tensor"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, t, Reduction::Mean, -100, Tensor(), 1.5),
                       doctest::Contains("label_smoothing must be in [0, 1], got 1.5"), weft::Error);
  CHECK_THROWS_WITH_AS(nll_loss(scalar_tensor(1.0), scalar_tensor(0.0, DType::Int64)),
                       doctest::Contains("got a 0-d tensor"), weft::Error);
}

// --- mse_loss -----------------------------------------------------------------------------

TEST_CASE("mse_loss: reductions against the definition, gradients in both inputs") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    double tol = dtype == DType::Float32 ? 1e-6 : 1e-13;
    Tensor a = test::random({5, 7}, dtype, 91), b = test::random({5, 7}, dtype, 92);
    std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), sq;
    double total = 0;
    for (size_t i = 0; i < av.size(); ++i) sq.push_back((av[i] - bv[i]) * (av[i] - bv[i])), total += sq.back();
    Tensor an = test::noncontiguous(a);
    CHECK_CLOSE(mse_loss(an, b, Reduction::None), tensor(sq, {5, 7}), tol, tol);
    CHECK_CLOSE(mse_loss(an, b, Reduction::Sum), scalar_tensor(total, DType::Float64), tol, tol);
    CHECK_CLOSE(mse_loss(a, b), scalar_tensor(total / 35, DType::Float64), tol, tol);
  }
  // A long input runs the blocked parallel sum.
  Tensor a = test::random({50001}, DType::Float32, 93), b = zeros({50001});
  double total = 0;
  for (double v : a.to_vector<double>()) total += v * v;
  CHECK(mse_loss(a, b, Reduction::Sum).item() == doctest::Approx(total).epsilon(1e-7));

  Tensor x = test::leaf({3, 4}, 94), y = test::leaf({3, 4}, 95);
  Tensor xn = test::noncontiguous(x).requires_grad_();
  for (Reduction r : kReductions) {
    CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], r); }, (std::vector<Tensor>{x, y}));
    CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], r); }, (std::vector<Tensor>{xn, y}));
  }
  // Only the input requires grad: the target gets none.
  Tensor target = test::random({3, 4}, DType::Float64, 96);
  Tensor input = test::leaf({3, 4}, 97);
  mse_loss(input, target).backward();
  CHECK_FALSE(target.grad().defined());
  CHECK_CLOSE(input.grad(), mul(sub(input.detach(), target), 2.0 / 12), 1e-15, 1e-14);
}

TEST_CASE("mse_loss errors") {
  Tensor a = ones({3, 4});
  CHECK_THROWS_WITH_AS(mse_loss(a, ones({4})),
                       doctest::Contains("mse_loss: input shape [3, 4] and target shape [4] differ"), weft::Error);
  CHECK_THROWS_WITH_AS(mse_loss(a, ones({3, 4}, DType::Float64)), doctest::Contains("mse_loss: dtype mismatch"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(mse_loss(ones({2}, DType::Int64), ones({2}, DType::Int64)),
                       doctest::Contains("mse_loss: expected a float32 or float64 tensor"), weft::Error);
  CHECK_THROWS_WITH_AS(mse_loss(a, a.to(Device("cpu:1"))), doctest::Contains("cpu:1"), weft::Error);
}
