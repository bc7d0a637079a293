// Pooling: forward against naive float64 loops written from the definitions, indices,
// hand-computed cases, gradcheck of every pool, thread-count independence, errors.
#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

using namespace weft;
using Pair = std::array<int64_t, 2>;

namespace {

struct PoolCase {
  Pair kernel, stride, padding, dilation;
  bool ceil_mode;
};

// PyTorch's output-size rule, written with floating-point floor / ceil.
int64_t ref_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  double span = static_cast<double>(in + 2 * p - d * (k - 1) - 1) / static_cast<double>(s);
  auto out = static_cast<int64_t>(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

struct Reference {
  Shape shape;
  std::vector<double> values;
  std::vector<int64_t> indices;
};

Pair resolved_stride(const PoolCase& c) { return c.stride[0] == 0 ? c.kernel : c.stride; }

Reference ref_max_pool(const Tensor& x, const PoolCase& c) {
  auto v = x.to_vector<double>();
  int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  Pair s = resolved_stride(c);
  int64_t oh = ref_out_size(h, c.kernel[0], s[0], c.padding[0], c.dilation[0], c.ceil_mode);
  int64_t ow = ref_out_size(w, c.kernel[1], s[1], c.padding[1], c.dilation[1], c.ceil_mode);
  Reference r{{n, ch, oh, ow}, {}, {}};
  for (int64_t plane = 0; plane < n * ch; ++plane)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t at = -1;
        for (int64_t a = 0; a < c.kernel[0]; ++a)
          for (int64_t b = 0; b < c.kernel[1]; ++b) {
            int64_t y = i * s[0] - c.padding[0] + a * c.dilation[0];
            int64_t z = j * s[1] - c.padding[1] + b * c.dilation[1];
            if (y < 0 || y >= h || z < 0 || z >= w) continue;
            double val = v[plane * h * w + y * w + z];
            if (at < 0 || val > best) best = val, at = y * w + z;
          }
        r.values.push_back(best);
        r.indices.push_back(at);
      }
  return r;
}

Reference ref_avg_pool(const Tensor& x, const PoolCase& c, bool count_include_pad) {
  auto v = x.to_vector<double>();
  int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  Pair s = resolved_stride(c);
  int64_t oh = ref_out_size(h, c.kernel[0], s[0], c.padding[0], 1, c.ceil_mode);
  int64_t ow = ref_out_size(w, c.kernel[1], s[1], c.padding[1], 1, c.ceil_mode);
  Reference r{{n, ch, oh, ow}, {}, {}};
  for (int64_t plane = 0; plane < n * ch; ++plane)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double sum = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t a = 0; a < c.kernel[0]; ++a)
          for (int64_t b = 0; b < c.kernel[1]; ++b) {
            int64_t y = i * s[0] - c.padding[0] + a, z = j * s[1] - c.padding[1] + b;
            // Taps beyond the right / bottom padding (ceil_mode) count for nothing.
            if (y < h + c.padding[0] && z < w + c.padding[1]) ++padded;
            if (y < 0 || y >= h || z < 0 || z >= w) continue;
            sum += v[plane * h * w + y * w + z];
            ++inside;
          }
        r.values.push_back(sum / static_cast<double>(count_include_pad ? padded : inside));
      }
  return r;
}

Reference ref_adaptive_avg(const Tensor& x, Pair out) {
  auto v = x.to_vector<double>();
  int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  Reference r{{n, ch, out[0], out[1]}, {}, {}};
  for (int64_t plane = 0; plane < n * ch; ++plane)
    for (int64_t i = 0; i < out[0]; ++i)
      for (int64_t j = 0; j < out[1]; ++j) {
        auto y0 = static_cast<int64_t>(std::floor(double(i * h) / double(out[0])));
        auto y1 = static_cast<int64_t>(std::ceil(double((i + 1) * h) / double(out[0])));
        auto z0 = static_cast<int64_t>(std::floor(double(j * w) / double(out[1])));
        auto z1 = static_cast<int64_t>(std::ceil(double((j + 1) * w) / double(out[1])));
        double sum = 0;
        for (int64_t y = y0; y < y1; ++y)
          for (int64_t z = z0; z < z1; ++z) sum += v[plane * h * w + y * w + z];
        r.values.push_back(sum / double((y1 - y0) * (z1 - z0)));
      }
  return r;
}

Tensor as_tensor(const Reference& r) { return tensor(r.values, r.shape); }

const std::vector<PoolCase> kMaxCases = {
    {{2, 2}, {}, {0, 0}, {1, 1}, false},  // stride {} = kernel
    {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
    {{3, 2}, {2, 1}, {1, 0}, {1, 1}, true},
    {{3, 3}, {2, 3}, {1, 1}, {2, 1}, false},  // dilation
    {{2, 3}, {3, 2}, {1, 1}, {2, 2}, true},   // dilation + ceil_mode
    {{3, 3}, {2, 2}, {0, 0}, {1, 1}, true},   // ceil_mode adds a partial window
    {{2, 2}, {2, 2}, {0, 0}, {1, 1}, true},   // the 2x2 fast path's shape, with partial windows on odd sizes
    {{1, 1}, {2, 2}, {0, 0}, {1, 1}, false},
    {{4, 5}, {1, 1}, {2, 2}, {1, 1}, false},
};

const std::vector<PoolCase> kAvgCases = {
    {{2, 2}, {}, {0, 0}, {1, 1}, false},
    {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
    {{3, 2}, {2, 1}, {1, 1}, {1, 1}, true},
    {{2, 2}, {2, 2}, {0, 0}, {1, 1}, true},  // last window clipped at the input edge
    {{3, 5}, {3, 2}, {1, 2}, {1, 1}, true},
    {{4, 4}, {3, 3}, {2, 1}, {1, 1}, true},
};

std::string describe(const PoolCase& c) {
  return detail::concat("kernel {", c.kernel[0], ",", c.kernel[1], "} stride {", c.stride[0], ",", c.stride[1],
                        "} padding {", c.padding[0], ",", c.padding[1], "} dilation {", c.dilation[0], ",",
                        c.dilation[1], "} ceil_mode ", c.ceil_mode);
}

}  // namespace

TEST_CASE("max_pool2d: hand-computed values and indices") {
  Tensor x = arange(0, 16, 1, DType::Float32).reshape({1, 1, 4, 4});
  auto [out, idx] = max_pool2d_with_indices(x, {2, 2});
  CHECK(out.shape() == Shape{1, 1, 2, 2});
  CHECK(out.to_vector<float>() == std::vector<float>{5, 7, 13, 15});
  CHECK(idx.dtype() == DType::Int64);
  CHECK(idx.to_vector<int64_t>() == std::vector<int64_t>{5, 7, 13, 15});
  // Padding never wins: all-negative input padded by one.
  Tensor neg_x = tensor({-4, -3, -2, -1}, {1, 2, 2});
  CHECK(max_pool2d(neg_x, {3, 3}, {1, 1}, {1, 1}).to_vector<float>() == std::vector<float>{-1, -1, -1, -1});
  // NaN propagates, reporting the last NaN of the window (PyTorch's CPU rule); a window
  // of -inf reports its first tap.
  Tensor with_nan = tensor({1, NAN, 3, NAN, 2, 1}, {1, 2, 3});
  auto [nan_out, nan_idx] = max_pool2d_with_indices(with_nan, {2, 2}, {1, 1});
  CHECK(std::isnan(nan_out.to_vector<double>()[0]));
  CHECK(std::isnan(nan_out.to_vector<double>()[1]));
  CHECK(nan_idx.to_vector<int64_t>() == std::vector<int64_t>{3, 1});
  const float inf = std::numeric_limits<float>::infinity();
  auto [inf_out, inf_idx] = max_pool2d_with_indices(tensor({-inf, -inf, -inf, 5}, {1, 2, 2}), {1, 2}, {1, 1}, {0, 1});
  CHECK(inf_out.to_vector<float>() == std::vector<float>{-inf, -inf, -inf, -inf, 5, 5});
  CHECK(inf_idx.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 2, 3, 3});
}

TEST_CASE("max_pool2d: 2x2, stride 2, ceil_mode on odd sizes: the partial windows stay inside the input") {
  // Issue 11, item 0: the 2x2 fast path read past the rows (and the plane) for the last
  // windows, and its backward wrote outside the input's gradient. PyTorch's values:
  Tensor x = arange(0, 15, 1, DType::Float32).reshape({1, 1, 3, 5}).requires_grad_();
  auto [out, idx] = max_pool2d_with_indices(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, /*ceil_mode=*/true);
  CHECK(out.shape() == Shape{1, 1, 2, 3});
  CHECK(out.to_vector<float>() == std::vector<float>{6, 8, 9, 11, 13, 14});
  CHECK(idx.to_vector<int64_t>() == std::vector<int64_t>{6, 8, 9, 11, 13, 14});
  sum(out).backward();
  std::vector<float> expected(15, 0.0f);
  for (int64_t i : {6, 8, 9, 11, 13, 14}) expected[i] = 1;
  CHECK(x.grad().to_vector<float>() == expected);
}

TEST_CASE("max_pool2d: forward and indices match a naive loop") {
  uint64_t seed = 10;
  for (const PoolCase& c : kMaxCases) {
    for (Shape shape : {Shape{2, 3, 7, 9}, Shape{1, 2, 6, 5}}) {
      CAPTURE(describe(c));
      CAPTURE(shape);
      Tensor x = test::random(shape, DType::Float64, ++seed);
      Reference ref = ref_max_pool(x, c);
      for (const Tensor& in : {x, test::noncontiguous(x), x.to(DType::Float32)}) {
        auto [out, idx] = max_pool2d_with_indices(in, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
        CHECK(out.dtype() == in.dtype());
        CHECK_CLOSE(out, as_tensor(ref).to(in.dtype()), 0, 0);
        CHECK(idx.to_vector<int64_t>() == ref.indices);
      }
    }
  }
}

TEST_CASE("max_pool2d: 3-d input, channel-sliced input and the empty batch") {
  Tensor x = test::random({3, 8, 7}, DType::Float64, 31);
  PoolCase c{{3, 2}, {2, 2}, {1, 1}, {1, 1}, true};
  Tensor out = max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
  Reference ref = ref_max_pool(x.unsqueeze(0), c);
  CHECK_CLOSE(out.unsqueeze(0), as_tensor(ref), 0, 0);
  CHECK(out.dim() == 3);

  Tensor wide = test::random({2, 6, 5, 5}, DType::Float32, 32);
  Tensor sliced = wide.slice(1, 1, 6, 2);  // channels 1, 3, 5: a non-contiguous channel stride
  CHECK_CLOSE(max_pool2d(sliced, {2, 2}, {1, 1}), max_pool2d(sliced.contiguous(), {2, 2}, {1, 1}), 0, 0);

  CHECK(max_pool2d(zeros({0, 2, 4, 4}), {2, 2}).shape() == Shape{0, 2, 2, 2});
}

TEST_CASE("avg_pool2d: hand-computed divisors") {
  Tensor ones5 = ones({1, 1, 5, 5}, DType::Float64);
  // Windows start at -1, 1, 3 and hold 2, 3, 2 input rows out of 3.
  Tensor inc = avg_pool2d(ones5, {3, 3}, {2, 2}, {1, 1}, true, true);
  CHECK_CLOSE(inc, tensor(std::vector<double>{4. / 9, 6. / 9, 4. / 9, 6. / 9, 1, 6. / 9, 4. / 9, 6. / 9, 4. / 9},
                          {1, 1, 3, 3}),
              1e-15, 0);
  CHECK_CLOSE(avg_pool2d(ones5, {3, 3}, {2, 2}, {1, 1}, true, false), ones({1, 1, 3, 3}, DType::Float64), 1e-15, 0);
  // ceil_mode's last window holds one element and divides by one, padding or not.
  Tensor row = arange(0, 5, 1, DType::Float64).reshape({1, 1, 1, 5});
  CHECK_CLOSE(avg_pool2d(row, {1, 2}, {}, {0, 0}, true, true), tensor(std::vector<double>{0.5, 2.5, 4}, {1, 1, 1, 3}),
              1e-15, 0);
}

TEST_CASE("avg_pool2d: forward matches a naive loop") {
  uint64_t seed = 40;
  for (const PoolCase& c : kAvgCases) {
    for (bool include_pad : {true, false}) {
      CAPTURE(describe(c));
      CAPTURE(include_pad);
      Tensor x = test::random({2, 3, 7, 9}, DType::Float64, ++seed);
      Tensor ref = as_tensor(ref_avg_pool(x, c, include_pad));
      CHECK_CLOSE(avg_pool2d(x, c.kernel, c.stride, c.padding, c.ceil_mode, include_pad), ref, 1e-14, 1e-12);
      CHECK_CLOSE(avg_pool2d(test::noncontiguous(x), c.kernel, c.stride, c.padding, c.ceil_mode, include_pad), ref,
                  1e-14, 1e-12);
      Tensor out32 = avg_pool2d(x.to(DType::Float32), c.kernel, c.stride, c.padding, c.ceil_mode, include_pad);
      CHECK(out32.dtype() == DType::Float32);
      CHECK_CLOSE(out32, ref, 1e-6, 1e-5);
    }
  }
  Tensor x3 = test::random({2, 5, 6}, DType::Float64, 49);
  CHECK_CLOSE(avg_pool2d(x3, {2, 3}, {1, 2}, {1, 1}).unsqueeze(0),
              as_tensor(ref_avg_pool(x3.unsqueeze(0), {{2, 3}, {1, 2}, {1, 1}, {1, 1}, false}, true)), 1e-14, 1e-12);
}

TEST_CASE("adaptive_avg_pool2d: overlapping windows and forward vs a naive loop") {
  // Rows [0, 2), [1, 4), [3, 5) of 0..4.
  Tensor row = arange(0, 5, 1, DType::Float64).reshape({1, 1, 1, 5});
  CHECK_CLOSE(adaptive_avg_pool2d(row, {1, 3}), tensor(std::vector<double>{0.5, 2, 3.5}, {1, 1, 1, 3}), 1e-15, 0);

  uint64_t seed = 60;
  for (Pair out : {Pair{3, 4}, Pair{1, 1}, Pair{7, 9}, Pair{2, 5}, Pair{10, 12}}) {
    CAPTURE(out[0]);
    CAPTURE(out[1]);
    Tensor x = test::random({2, 3, 7, 9}, DType::Float64, ++seed);
    Tensor ref = as_tensor(ref_adaptive_avg(x, out));
    CHECK_CLOSE(adaptive_avg_pool2d(x, out), ref, 1e-14, 1e-12);
    CHECK_CLOSE(adaptive_avg_pool2d(test::noncontiguous(x), out), ref, 1e-14, 1e-12);
    CHECK_CLOSE(adaptive_avg_pool2d(x.to(DType::Float32), out), ref, 1e-6, 1e-5);
  }
  Tensor x3 = test::random({3, 5, 4}, DType::Float64, 69);
  CHECK(adaptive_avg_pool2d(x3, {2, 3}).shape() == Shape{3, 2, 3});
}

TEST_CASE("max_pool2d: gradcheck (inputs without ties)") {
  uint64_t seed = 100;
  for (const PoolCase& c : {kMaxCases[0], kMaxCases[2], kMaxCases[3], kMaxCases[4], kMaxCases[7]}) {
    CAPTURE(describe(c));
    Tensor x = test::leaf({1, 2, 5, 6}, ++seed);
    auto fn = [c](const std::vector<Tensor>& in) {
      return max_pool2d(in[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
    };
    CHECK_GRADCHECK(fn, {x});
  }
  Tensor nc = test::noncontiguous(test::random({2, 2, 4, 5}, DType::Float64, 120)).requires_grad_();
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {3, 3}, {1, 2}, {1, 1}); },
                  {nc});
  Tensor x3 = test::leaf({2, 5, 4}, 121);
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2, 2}, {1, 1}); }, {x3});
}

TEST_CASE("max_pool2d: backward scatters to the argmax, overlapping windows add up") {
  Tensor x = test::random({2, 3, 9, 8}, DType::Float32, 130).requires_grad_();
  auto [out, idx] = max_pool2d_with_indices(x, {3, 3}, {1, 2}, {1, 1});
  Tensor g = test::random(out.shape(), DType::Float32, 131);
  out.backward(g);
  std::vector<double> expected(x.numel(), 0.0);
  auto gv = g.to_vector<double>();
  auto iv = idx.to_vector<int64_t>();
  int64_t plane_out = out.size(2) * out.size(3), plane_in = 9 * 8;
  for (int64_t k = 0; k < out.numel(); ++k) expected[(k / plane_out) * plane_in + iv[k]] += gv[k];
  CHECK_CLOSE(x.grad(), tensor(expected, x.shape()), 1e-6, 1e-6);
}

TEST_CASE("avg_pool2d and adaptive_avg_pool2d: gradcheck") {
  uint64_t seed = 200;
  for (const PoolCase& c : kAvgCases) {
    for (bool include_pad : {true, false}) {
      CAPTURE(describe(c));
      CAPTURE(include_pad);
      Tensor x = test::leaf({1, 2, 5, 6}, ++seed);
      auto fn = [c, include_pad](const std::vector<Tensor>& in) {
        return avg_pool2d(in[0], c.kernel, c.stride, c.padding, c.ceil_mode, include_pad);
      };
      CHECK_GRADCHECK(fn, {x});
    }
  }
  Tensor nc = test::noncontiguous(test::random({2, 2, 4, 5}, DType::Float64, 220)).requires_grad_();
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, true); },
                  {nc});
  for (Pair out : {Pair{3, 4}, Pair{2, 2}, Pair{6, 7}}) {
    Tensor x = test::leaf({1, 2, 5, 6}, ++seed);
    CHECK_GRADCHECK([out](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], out); }, {x});
  }
  Tensor nc3 = test::noncontiguous(test::random({2, 5, 4}, DType::Float64, 230)).requires_grad_();
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {3, 3}); }, {nc3});
}

TEST_CASE("pooling: results do not depend on the thread count") {
  Tensor x = test::random({4, 16, 33, 31}, DType::Float32, 300).requires_grad_();
  auto run = [&](int threads) {
    set_num_threads(threads);
    x.set_grad(Tensor());
    Tensor loss = add(add(sum(mul(max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), 1.5)),
                          sum(avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}))),
                      sum(adaptive_avg_pool2d(x, {5, 7})));
    loss.backward();
    return x.grad().clone();
  };
  int threads = num_threads();
  Tensor one = run(1);
  Tensor many = run(std::max(threads, 2));
  set_num_threads(threads);
  CHECK_CLOSE(many, one, 0, 0);
}

TEST_CASE("pooling: errors") {
  Tensor x = test::random({1, 2, 6, 6}, DType::Float32, 400);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {3, 3}, {1, 1}, {2, 2}), doctest::Contains("at most half of kernel_size"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {2, 2}, {1, 1}, {2, 1}), doctest::Contains("at most half of kernel_size"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x.select(0, 0).select(0, 0), {2, 2}), doctest::Contains("3-d [C, H, W] or 4-d"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x.to(DType::Int64), {2, 2}), doctest::Contains("float32 or float64"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {0, 2}), doctest::Contains("kernel_size must be positive"), weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {2, 2}, {-1, 1}), doctest::Contains("stride must be positive"), weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {2, 2}, {1, 1}, {0, 0}, {0, 1}), doctest::Contains("dilation must be positive"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {4, 4}, {1, 1}, {0, 0}, {2, 2}), doctest::Contains("too small"), weft::Error);
  // Rows -1 and 2 of a 2-row input: the first window holds no element at all.
  CHECK_THROWS_WITH_AS(max_pool2d(test::random({1, 1, 2, 2}, DType::Float32, 401), {2, 2}, {2, 2}, {1, 1}, {3, 3}),
                       doctest::Contains("would cover only padding"), weft::Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {7, 2}), doctest::Contains("too small"), weft::Error);
  CHECK_THROWS_WITH_AS(adaptive_avg_pool2d(x, {0, 2}), doctest::Contains("output_size must be positive"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(zeros({1, 0, 4, 4}), {2, 2}), doctest::Contains("non-zero C, H and W"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max_pool2d(Tensor(), {2, 2}), doctest::Contains("undefined"), weft::Error);
}

TEST_CASE("max_pool2d 2x2 fast path agrees with the general path on ties and NaN") {
  // Small integers give many ties; a few NaNs go in as well. A non-unit inner stride
  // sends the same values through the general path.
  Generator gen(77);
  Tensor x = randint(0, 3, {2, 3, 6, 8}, DType::Int64, &gen).to(DType::Float32);
  Tensor flat = x.view({-1});
  for (int64_t i : {5, 40, 41, 170, 287}) fill_(flat.narrow(0, i, 1), NAN);
  Tensor strided = zeros({2, 3, 6, 16}).slice(3, 0, 16, 2);
  strided.copy_(x);
  REQUIRE(strided.stride(3) == 2);
  auto [fast, fast_idx] = max_pool2d_with_indices(x, {2, 2});
  auto [general, general_idx] = max_pool2d_with_indices(strided, {2, 2});
  CHECK(fast_idx.to_vector<int64_t>() == general_idx.to_vector<int64_t>());
  auto a = fast.to_vector<float>(), b = general.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) CHECK(((a[i] == b[i]) || (std::isnan(a[i]) && std::isnan(b[i]))));
}
