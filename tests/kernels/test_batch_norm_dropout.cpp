// batch_norm (training and evaluation, running-stat updates, gradients) and dropout
// (mask statistics, scaling, reproducibility, gradient), against references written here.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/dropout_kernels.h"
#include "test_util.h"

using namespace weft;

namespace {

struct BatchNormRef {
  Tensor out;
  std::vector<double> mean, biased_var;
};

// Naive float64 batch norm over every dim but 1, from the definition. mean / var are
// the batch's (training) or given (evaluation).
BatchNormRef ref_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                            const Tensor& use_mean = Tensor(), const Tensor& use_var = Tensor()) {
  auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / std::max<int64_t>(1, n * c);
  BatchNormRef r;
  r.mean.assign(c, 0.0);
  r.biased_var.assign(c, 0.0);
  for (int64_t k = 0; k < c; ++k) {
    double sum = 0, sq = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) sum += v[(b * c + k) * s + i];
    r.mean[k] = sum / double(n * s);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) sq += std::pow(v[(b * c + k) * s + i] - r.mean[k], 2);
    r.biased_var[k] = sq / double(n * s);
  }
  std::vector<double> m = use_mean.defined() ? use_mean.to_vector<double>() : r.mean;
  std::vector<double> var = use_var.defined() ? use_var.to_vector<double>() : r.biased_var;
  std::vector<double> w = weight.defined() ? weight.to_vector<double>() : std::vector<double>(c, 1.0);
  std::vector<double> bi = bias.defined() ? bias.to_vector<double>() : std::vector<double>(c, 0.0);
  std::vector<double> out(v.size());
  for (size_t e = 0; e < v.size(); ++e) {
    int64_t k = (static_cast<int64_t>(e) / s) % c;
    out[e] = (v[e] - m[k]) / std::sqrt(var[k] + eps) * w[k] + bi[k];
  }
  r.out = tensor(out, x.shape());
  return r;
}

Tensor vec(const std::vector<double>& values) { return tensor(values); }

}  // namespace

TEST_CASE("batch_norm: training forward matches a naive loop") {
  uint64_t seed = 1;
  for (Shape shape : {Shape{5, 3}, Shape{4, 3, 5, 7}, Shape{3, 2, 5}, Shape{2, 4, 3, 1, 2}}) {
    CAPTURE(shape);
    const int64_t c = shape[1];
    Tensor x = test::random(shape, DType::Float64, ++seed, -2, 3);
    Tensor w = test::random({c}, DType::Float64, ++seed);
    Tensor b = test::random({c}, DType::Float64, ++seed);
    BatchNormRef ref = ref_batch_norm(x, w, b, 1e-5);
    CHECK_CLOSE(batch_norm(x, Tensor(), Tensor(), w, b, true), ref.out, 1e-12, 1e-12);
    CHECK_CLOSE(batch_norm(test::noncontiguous(x), Tensor(), Tensor(), w, b, true), ref.out, 1e-12, 1e-12);
    // No affine parameters, another eps.
    CHECK_CLOSE(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 0.5),
                ref_batch_norm(x, Tensor(), Tensor(), 0.5).out, 1e-12, 1e-12);
    Tensor out32 = batch_norm(x.to(DType::Float32), Tensor(), Tensor(), w.to(DType::Float32), b.to(DType::Float32), true);
    CHECK(out32.dtype() == DType::Float32);
    CHECK_CLOSE(out32, ref_batch_norm(x.to(DType::Float32), w, b, 1e-5).out, 1e-5, 1e-5);
  }
}

TEST_CASE("batch_norm: float32 statistics stay accurate when the mean dwarfs the spread") {
  Tensor x = add(test::random({64, 2, 9}, DType::Float32, 20), 1.0e4);
  BatchNormRef ref = ref_batch_norm(x, Tensor(), Tensor(), 1e-5);
  CHECK_CLOSE(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true), ref.out, 2e-3, 0);
}

TEST_CASE("batch_norm: running statistics, hand-computed") {
  // Channel 0: 1, 2, 3, 4 (mean 2.5, unbiased var 5/3); channel 1: 2, 4, 6, 10 (mean 5.5,
  // unbiased var 35/3).
  Tensor x = tensor(std::vector<double>{1, 2, 2, 4, 3, 6, 4, 10}, {4, 2});
  Tensor rm = vec({0, 1}), rv = vec({1, 2});
  uint32_t version = rm.version();
  Tensor out = batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.1, 0);
  CHECK_CLOSE(rm, vec({0.25, 0.9 + 0.55}), 1e-15, 1e-15);
  CHECK_CLOSE(rv, vec({0.9 + 0.1 * 5.0 / 3.0, 1.8 + 0.1 * 35.0 / 3.0}), 1e-15, 1e-15);
  CHECK(rm.version() != version);
  // The batch itself is normalised with the biased variance (1.25 for channel 0).
  CHECK(out.to_vector<double>()[0] == doctest::Approx(-1.5 / std::sqrt(1.25)).epsilon(1e-14));

  // Evaluation uses, and leaves alone, the running statistics.
  Tensor eval = batch_norm(x, rm, rv, Tensor(), Tensor(), false, 0.1, 0);
  CHECK_CLOSE(rm, vec({0.25, 1.45}), 1e-15, 1e-15);
  CHECK(eval.to_vector<double>()[0] == doctest::Approx((1 - 0.25) / std::sqrt(0.9 + 0.5 / 3.0)).epsilon(1e-14));
}

TEST_CASE("batch_norm: running statistics vs a reference, float32 and strided buffers") {
  Tensor x = test::random({6, 3, 4, 5}, DType::Float64, 30, -1, 2);
  BatchNormRef ref = ref_batch_norm(x, Tensor(), Tensor(), 1e-5);
  const double momentum = 0.3, count = 6 * 4 * 5;
  Tensor rm0 = test::random({3}, DType::Float64, 31), rv0 = test::random({3}, DType::Float64, 32, 0.5, 2);
  std::vector<double> expect_mean, expect_var;
  for (int64_t k = 0; k < 3; ++k) {
    expect_mean.push_back((1 - momentum) * rm0.to_vector<double>()[k] + momentum * ref.mean[k]);
    expect_var.push_back((1 - momentum) * rv0.to_vector<double>()[k] +
                         momentum * ref.biased_var[k] * count / (count - 1));
  }
  // Every other element of a longer buffer: the update must honour the stride.
  Tensor rm = test::noncontiguous(rm0), rv = test::noncontiguous(rv0);
  CHECK_FALSE(rm.is_contiguous());
  batch_norm(x, rm, rv, Tensor(), Tensor(), true, momentum);
  CHECK_CLOSE(rm, vec(expect_mean), 1e-14, 1e-12);
  CHECK_CLOSE(rv, vec(expect_var), 1e-14, 1e-12);

  Tensor rm32 = rm0.to(DType::Float32), rv32 = rv0.to(DType::Float32);
  batch_norm(x.to(DType::Float32), rm32, rv32, Tensor(), Tensor(), true, momentum);
  CHECK_CLOSE(rm32, vec(expect_mean), 1e-6, 1e-5);
  CHECK_CLOSE(rv32, vec(expect_var), 1e-6, 1e-5);
}

TEST_CASE("batch_norm: evaluation forward matches a naive loop") {
  Tensor x = test::random({3, 4, 5, 2}, DType::Float64, 40);
  Tensor rm = test::random({4}, DType::Float64, 41), rv = test::random({4}, DType::Float64, 42, 0.2, 3);
  Tensor w = test::random({4}, DType::Float64, 43), b = test::random({4}, DType::Float64, 44);
  Tensor ref = ref_batch_norm(x, w, b, 1e-3, rm, rv).out;
  CHECK_CLOSE(batch_norm(x, rm, rv, w, b, false, 0.1, 1e-3), ref, 1e-12, 1e-12);
  CHECK_CLOSE(batch_norm(test::noncontiguous(x), rm, rv, w, b, false, 0.1, 1e-3), ref, 1e-12, 1e-12);
  Tensor x2 = test::random({7, 4}, DType::Float64, 45);
  CHECK_CLOSE(batch_norm(x2, rm, rv, w, Tensor(), false), ref_batch_norm(x2, w, Tensor(), 1e-5, rm, rv).out, 1e-12,
              1e-12);
  // An empty batch is fine in evaluation.
  CHECK(batch_norm(zeros({0, 4, 3}, DType::Float64), rm, rv, w, b, false).shape() == Shape{0, 4, 3});
}

TEST_CASE("batch_norm: gradcheck of input, weight and bias") {
  uint64_t seed = 100;
  for (Shape shape : {Shape{4, 3}, Shape{2, 3, 2, 3}}) {
    for (bool training : {true, false}) {
      CAPTURE(shape);
      CAPTURE(training);
      Tensor x = test::leaf(shape, ++seed);
      Tensor w = test::leaf({3}, ++seed);
      Tensor b = test::leaf({3}, ++seed);
      Tensor rm = test::random({3}, DType::Float64, ++seed);
      Tensor rv = test::random({3}, DType::Float64, ++seed, 0.5, 2);
      auto fn = [&](const std::vector<Tensor>& in) {
        // Fresh buffers per call: training updates them.
        return batch_norm(in[0], rm.clone(), rv.clone(), in[1], in[2], training, 0.1, 1e-3);
      };
      CHECK_GRADCHECK(fn, (std::vector<Tensor>{x, w, b}));
      Tensor nc = test::noncontiguous(test::random(shape, DType::Float64, ++seed)).requires_grad_();
      CHECK_GRADCHECK(fn, (std::vector<Tensor>{nc, w, b}));
      // Input alone, without affine parameters.
      auto plain = [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], rm.clone(), rv.clone(), Tensor(), Tensor(), training);
      };
      CHECK_GRADCHECK(plain, {x});
    }
  }
  // Weight and bias alone (input held fixed), 3-d input.
  Tensor x = test::random({3, 2, 4}, DType::Float64, 150);
  Tensor w = test::leaf({2}, 151), b = test::leaf({2}, 152);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return batch_norm(x, Tensor(), Tensor(), in[0], in[1], true); },
                  (std::vector<Tensor>{w, b}));
}

TEST_CASE("batch_norm: float32 gradients agree with float64") {
  Tensor x64 = test::random({8, 3, 6}, DType::Float64, 160);
  Tensor w64 = test::random({3}, DType::Float64, 161);
  Tensor g = test::random({8, 3, 6}, DType::Float64, 162);
  auto grads = [&](DType dtype) {
    Tensor x = x64.to(dtype).detach().requires_grad_(), w = w64.to(dtype).detach().requires_grad_();
    Tensor b = zeros({3}, dtype).requires_grad_();
    batch_norm(x, Tensor(), Tensor(), w, b, true).backward(g.to(dtype));
    return std::vector<Tensor>{x.grad(), w.grad(), b.grad()};
  };
  auto f64 = grads(DType::Float64), f32 = grads(DType::Float32);
  for (size_t i = 0; i < 3; ++i) CHECK_CLOSE(f32[i], f64[i], 1e-5, 1e-4);
}

TEST_CASE("batch_norm: errors") {
  Tensor x = test::random({4, 3, 2}, DType::Float32, 200);
  Tensor c3 = ones({3}), rm = zeros({3}), rv = ones({3});
  CHECK_THROWS_WITH_AS(batch_norm(x.narrow(0, 0, 1).narrow(2, 0, 1), Tensor(), Tensor(), c3, c3, true),
                       doctest::Contains("expected more than 1 value per channel when training"), weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(ones({1, 3}), rm, rv, Tensor(), Tensor(), true),
                       doctest::Contains("expected more than 1 value per channel when training"), weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, rm, rv, ones({4}), c3, true), doctest::Contains("expected 'weight' of shape [3]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, rm, rv, c3, ones({3, 1}), true), doctest::Contains("expected 'bias' of shape [3]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, rm.to(DType::Float64), rv, c3, c3, true), doctest::Contains("dtype mismatch"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, rm, rv, c3.to(Device("cpu:1")), c3, true), doctest::Contains("cpu:1"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, Tensor(), Tensor(), c3, c3, false),
                       doctest::Contains("required in evaluation mode"), weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, rm, Tensor(), c3, c3, true), doctest::Contains("must be given together"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(ones({5}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("[N, C] or [N, C, *]"), weft::Error);
  CHECK_THROWS_WITH_AS(batch_norm(x.to(DType::Int64), Tensor(), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("float32 or float64"), weft::Error);
  Tensor rm_grad = zeros({3}).requires_grad_();
  CHECK_THROWS_WITH_AS(batch_norm(x, rm_grad, rv, c3, c3, true), doctest::Contains("buffers"), weft::Error);
}

TEST_CASE("dropout: fraction of zeros, scaling, p == 0 / 1 and evaluation") {
  const double p = 0.3;
  Generator gen(11);
  Tensor x = test::random({1024, 1024}, DType::Float32, 300, 1, 2);  // never zero
  Tensor out = dropout(x, p, true, &gen);
  auto o = out.to_vector<double>();
  auto xv = x.to_vector<double>();
  int64_t zeros_seen = 0, bad_scale = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    if (o[i] == 0) ++zeros_seen;
    else if (std::fabs(o[i] - xv[i] / (1 - p)) > 1e-6 * std::fabs(o[i])) ++bad_scale;
  }
  // Binomial(2^20, 0.3): the standard deviation of the fraction is 4.5e-4.
  CHECK(std::fabs(double(zeros_seen) / double(o.size()) - p) < 5e-3);
  CHECK(bad_scale == 0);

  CHECK(dropout(x, p, false, &gen).is_same(x));
  CHECK(dropout(x, 0.0, true, &gen).is_same(x));
  Tensor all = dropout(x, 1.0, true, &gen);
  CHECK(all.shape() == x.shape());
  CHECK(sum(abs(all)).item() == 0.0);

  Tensor x64 = test::random({257}, DType::Float64, 301, 1, 2);
  Tensor out64 = dropout(x64, 0.75, true, &gen);
  auto o64 = out64.to_vector<double>();
  auto x64v = x64.to_vector<double>();
  for (size_t i = 0; i < o64.size(); ++i)
    if (o64[i] != 0) CHECK(o64[i] == doctest::Approx(x64v[i] * 4).epsilon(1e-15));
}

TEST_CASE("dropout: the mask is reproducible from a seed and depends on it") {
  Tensor x = test::random({33, 65}, DType::Float64, 310, 1, 2);
  Generator a(5), b(5), c(6);
  Tensor ma = dropout(x, 0.5, true, &a), mb = dropout(x, 0.5, true, &b), mc = dropout(x, 0.5, true, &c);
  CHECK_CLOSE(ma, mb, 0, 0);
  CHECK(sum(ne(eq(ma, 0.0), eq(mc, 0.0)).to(DType::Float64)).item() > 0);
  // The next draw from the same generator is a different mask.
  CHECK(sum(ne(eq(dropout(x, 0.5, true, &a), 0.0), eq(ma, 0.0)).to(DType::Float64)).item() > 0);
  // The default generator, seeded.
  manual_seed(77);
  Tensor d1 = dropout(x, 0.5);
  manual_seed(77);
  CHECK_CLOSE(dropout(x, 0.5), d1, 0, 0);
  // Layout and thread count do not change the mask.
  Generator e(5);
  int threads = num_threads();
  set_num_threads(1);
  CHECK_CLOSE(dropout(test::noncontiguous(x), 0.5, true, &e), ma, 0, 0);
  set_num_threads(threads);
}

TEST_CASE("dropout: gradient is the saved mask times the scale") {
  const double p = 0.4;
  Tensor x = test::random({17, 9}, DType::Float64, 320, 1, 2).requires_grad_();
  Generator gen(9);
  Tensor out = dropout(x, p, true, &gen);
  Tensor g = test::random({17, 9}, DType::Float64, 321);
  out.backward(g);
  auto o = out.to_vector<double>();
  auto gv = g.to_vector<double>();
  std::vector<double> expected(o.size());
  for (size_t i = 0; i < o.size(); ++i) expected[i] = o[i] == 0 ? 0.0 : gv[i] / (1 - p);
  CHECK_CLOSE(x.grad(), tensor(expected, x.shape()), 1e-15, 1e-14);

  // gradcheck with a mask fixed by reseeding inside the function.
  Tensor leaf = test::noncontiguous(test::random({4, 5}, DType::Float64, 322)).requires_grad_();
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        Generator fixed(3);
        return dropout(in[0], 0.5, true, &fixed);
      },
      {leaf});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return dropout(in[0], 1.0, true); }, {leaf});
}

TEST_CASE("dropout kernel: a uniform survives exactly when it is >= p, at the float32 boundary too") {
  // p = 0.7 rounds down to float32 (comparing with float(p) would keep the float just
  // below 0.7) and p = 0.3 up; the kernel must decide as a comparison in double would,
  // on the contiguous and the strided path.
  for (double p : {0.7, 0.3, 0.1, 1.0 / 3, 0.5}) {
    CAPTURE(p);
    const float fp = static_cast<float>(p);
    std::vector<float> u;
    for (float f = std::nextafter(std::nextafter(fp, 0.0f), 0.0f); u.size() < 5; f = std::nextafter(f, 1.0f))
      u.push_back(f);
    u.insert(u.end(), {0.0f, 0x1.fffffep-1f, 0.5f});
    const auto n = static_cast<int64_t>(u.size());
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    for (bool contiguous : {true, false}) {
      Tensor x = test::random({n}, DType::Float32, 330, 1, 2);
      Tensor input = contiguous ? x : test::noncontiguous(x);
      Tensor mask = tensor(u, {n}), out = full({n}, std::nan(""), DType::Float32);
      dropout_stub(kCPU, input, mask, out, p);
      auto m = mask.to_vector<float>();
      auto o = out.to_vector<float>();
      auto xv = x.to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        CAPTURE(u[i]);
        const float expected = static_cast<double>(u[i]) >= p ? scale : 0.0f;
        CHECK(m[i] == expected);
        CHECK(o[i] == xv[i] * expected);
      }
    }
  }
  // float64: the threshold is p itself.
  const double p = 0.7;
  Tensor mask = tensor(std::vector<double>{std::nextafter(p, 0.0), p, std::nextafter(p, 1.0)}, {3});
  Tensor out = empty({3}, DType::Float64);
  dropout_stub(kCPU, ones({3}, DType::Float64), mask, out, p);
  CHECK(mask.to_vector<double>() == std::vector<double>{0.0, 1 / (1 - p), 1 / (1 - p)});
}

TEST_CASE("dropout: errors") {
  Tensor x = ones({4});
  CHECK_THROWS_WITH_AS(dropout(x, -0.1), doctest::Contains("p must be in [0, 1], got -0.1"), weft::Error);
  CHECK_THROWS_WITH_AS(dropout(x, 1.5), doctest::Contains("p must be in [0, 1]"), weft::Error);
  CHECK_THROWS_WITH_AS(dropout(x, std::nan("")), doctest::Contains("p must be in [0, 1]"), weft::Error);
  CHECK_THROWS_WITH_AS(dropout(x.to(DType::Int64), 0.5), doctest::Contains("float32 or float64"), weft::Error);
  CHECK_THROWS_WITH_AS(dropout(Tensor(), 0.5), doctest::Contains("undefined"), weft::Error);
}
