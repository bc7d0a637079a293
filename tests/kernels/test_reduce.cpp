// Reductions: forward against a naive float64 reference over many dim sets, gradients
// by finite differences, ties, determinism across thread counts, and error texts.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "test_util.h"

using namespace weft;

namespace {

// Elements of x grouped by output position: group g holds, in row-major input order,
// the elements whose kept-dim coordinates are the g-th in row-major order.
struct Groups {
  std::vector<std::vector<double>> values;
  Shape out_shape;  // keepdim = false
  Shape kept_shape; // keepdim = true
};

Groups group(const Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t nd = x.dim();
  std::vector<bool> mask(nd, dims.empty());
  for (int64_t d : dims) mask[d < 0 ? d + nd : d] = true;
  Groups g;
  for (int64_t d = 0; d < nd; ++d) {
    if (!mask[d]) g.out_shape.push_back(x.shape()[d]);
    g.kept_shape.push_back(mask[d] ? 1 : x.shape()[d]);
  }
  g.values.resize(g.out_shape.numel());
  std::vector<double> flat = x.to_vector<double>();
  for (int64_t i = 0; i < static_cast<int64_t>(flat.size()); ++i) {
    int64_t rest = i, out = 0, scale = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      int64_t idx = rest % x.shape()[d];
      rest /= x.shape()[d];
      if (!mask[d]) out += idx * scale, scale *= x.shape()[d];
    }
    g.values[out].push_back(flat[i]);
  }
  return g;
}

using Fold = std::function<double(const std::vector<double>&)>;

double ref_sum(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e;
  return s;
}
double ref_mean(const std::vector<double>& v) { return ref_sum(v) / v.size(); }
double ref_max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double ref_min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
Fold ref_var(int64_t correction) {
  return [correction](const std::vector<double>& v) {
    double m = ref_mean(v), s = 0;
    for (double e : v) s += (e - m) * (e - m);
    return s / std::max<double>(0, static_cast<double>(v.size()) - correction);
  };
}
double ref_argmax(const std::vector<double>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }
double ref_argmin(const std::vector<double>& v) { return std::min_element(v.begin(), v.end()) - v.begin(); }

Tensor reference(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const Fold& fold) {
  Groups g = group(x, dims);
  std::vector<double> out;
  for (const auto& v : g.values) out.push_back(fold(v));
  return tensor(out, keepdim ? g.kept_shape : g.out_shape);
}

const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {2, 0}, {-1, -3}, {1, 2}, {0, 1, 2}};

}  // namespace

TEST_CASE("sum, mean, amax, amin, var match a float64 reference over dim sets") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)> op;
    Fold ref;
  };
  std::vector<Case> cases = {
      {"sum", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); }, ref_sum},
      {"mean", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); }, ref_mean},
      {"amax", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amax(x, d, k); }, ref_max},
      {"amin", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amin(x, d, k); }, ref_min},
      {"var", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 1, k); }, ref_var(1)},
      {"var0", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 0, k); }, ref_var(0)},
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    double tol = dtype == DType::Float32 ? 1e-5 : 1e-12;
    Tensor base = test::random({3, 5, 7}, dtype, 11);
    for (bool contiguous : {true, false}) {
      Tensor x = contiguous ? base : test::noncontiguous(base);
      for (const auto& c : cases)
        for (const auto& dims : kDimSets)
          for (bool keepdim : {false, true}) {
            CAPTURE(c.name);
            CAPTURE(dtype);
            CAPTURE(contiguous);
            CAPTURE(keepdim);
            CAPTURE(dims.size());
            Tensor out = c.op(x, dims, keepdim);
            CHECK(out.dtype() == dtype);
            CHECK_CLOSE(out, reference(x, dims, keepdim, c.ref), tol, tol);
          }
    }
  }
}

TEST_CASE("reductions of a contiguous view with an offset read the right elements") {
  Tensor base = test::random({6, 4, 9}, DType::Float64, 12);
  Tensor x = base.narrow(0, 2, 3);  // contiguous, offset 72
  REQUIRE(x.is_contiguous());
  CHECK_CLOSE(sum(x, {1, 2}), reference(x, {1, 2}, false, ref_sum), 1e-12, 1e-12);
  CHECK_CLOSE(amax(x), reference(x, {}, false, ref_max), 0, 0);
  CHECK_CLOSE(argmax(x, 2), reference(x, {2}, false, ref_argmax), 0, 0);
}

TEST_CASE("integer and bool sums accumulate and return int64") {
  // Issue 11, item 5: 100 rows of 200 uint8 ones summed to 20000 mod 256.
  Tensor ones_u8 = ones({100, 200}, TensorOptions(DType::UInt8));
  CHECK(sum(ones_u8).dtype() == DType::Int64);
  CHECK(sum(ones_u8).item<int64_t>() == 20000);
  CHECK(sum(ones_u8, {0}).to_vector<int64_t>() == std::vector<int64_t>(200, 100));
  Tensor big = full({3}, 2000000000.0, TensorOptions(DType::Int32));
  CHECK(sum(big).item<int64_t>() == 6000000000LL);
  Tensor flags = gt(tensor(std::vector<double>{1, -1, 2, 3}, Shape{4}), 0.0);
  CHECK(sum(flags).dtype() == DType::Int64);
  CHECK(sum(flags).item<int64_t>() == 3);
}

TEST_CASE("integer reductions: sum, amax, amin, argmax, argmin") {
  for (DType dtype : {DType::Int64, DType::Int32}) {
    Tensor x = mul(test::random({4, 3, 5}, DType::Float64, 13), 20.0).to(dtype);
    for (const auto& dims : kDimSets) {
      CAPTURE(dtype);
      CAPTURE(dims.size());
      Tensor s = sum(x, dims);
      CHECK(s.dtype() == DType::Int64);  // as PyTorch: integers sum to int64
      CHECK_CLOSE(s, reference(x, dims, false, ref_sum).to(DType::Int64), 0, 0);
      CHECK_CLOSE(amax(x, dims, true), reference(x, dims, true, ref_max), 0, 0);
      CHECK_CLOSE(amin(x, dims), reference(x, dims, false, ref_min), 0, 0);
    }
    for (int64_t d : {0, 1, 2, -1}) {
      Tensor xn = test::noncontiguous(x);
      CHECK(argmax(xn, d).dtype() == DType::Int64);
      CHECK_CLOSE(argmax(xn, d), reference(x, {d}, false, ref_argmax), 0, 0);
      CHECK_CLOSE(argmin(xn, d, true), reference(x, {d}, true, ref_argmin), 0, 0);
    }
    CHECK_THROWS_WITH_AS(mean(x), doctest::Contains("mean: expected a float32 or float64 tensor"), weft::Error);
    CHECK_THROWS_WITH_AS(var(x), doctest::Contains("var: expected a float32 or float64 tensor"), weft::Error);
  }
}

TEST_CASE("argmax / argmin: first of ties, flattened without dim, NaN, keepdim shapes") {
  Tensor x = tensor({1, 3, 3, 2, 3, -1, -1}, {7});
  CHECK(argmax(x).item<int64_t>() == 1);
  CHECK(argmin(x).item<int64_t>() == 5);
  Tensor m = tensor({2, 5, 5, 0, 0, 0, 7, 1, 7}, {3, 3});
  CHECK(argmax(m, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
  CHECK(argmax(m, 0).to_vector<int64_t>() == std::vector<int64_t>{2, 0, 2});
  CHECK(argmin(m, -1).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1});
  CHECK(argmax(m).item<int64_t>() == 6);
  CHECK(argmax(m).dim() == 0);
  CHECK(argmax(m, {}, true).shape() == Shape{1, 1});
  CHECK(argmax(m, 0, true).shape() == Shape{1, 3});
  CHECK(argmax(test::noncontiguous(m)).item<int64_t>() == 6);

  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor with_nan = tensor({1, nan, 5, nan}, {4});
  CHECK(argmax(with_nan).item<int64_t>() == 1);
  CHECK(argmin(with_nan).item<int64_t>() == 1);
  CHECK(std::isnan(amax(with_nan).item()));
  CHECK(std::isnan(amin(with_nan).item()));

  // Ties across the kernel's block boundary of a long row keep the first index.
  Tensor long_row = zeros({3, 20000}, DType::Float64);
  long_row.narrow(1, 9000, 1).copy_(scalar_tensor(4.0));
  long_row.narrow(1, 17000, 1).copy_(scalar_tensor(4.0));
  CHECK(argmax(long_row, 1).to_vector<int64_t>() == std::vector<int64_t>{9000, 9000, 9000});
  CHECK(argmax(long_row).item<int64_t>() == 9000);
  CHECK(argmin(long_row, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
}

TEST_CASE("max / min along a dim return values and first indices") {
  Tensor x = test::random({4, 6, 3}, DType::Float64, 14);
  for (int64_t d : {0, 1, 2, -2}) {
    for (bool keepdim : {false, true}) {
      auto [values, indices] = max(test::noncontiguous(x), d, keepdim);
      CHECK_CLOSE(values, reference(x, {d}, keepdim, ref_max), 0, 0);
      CHECK_CLOSE(indices, reference(x, {d}, keepdim, ref_argmax), 0, 0);
      auto [vmin, imin] = min(x, d, keepdim);
      CHECK_CLOSE(vmin, reference(x, {d}, keepdim, ref_min), 0, 0);
      CHECK_CLOSE(imin, reference(x, {d}, keepdim, ref_argmin), 0, 0);
    }
  }
  auto [v, i] = max(tensor({2, 9, 9, 1}, {2, 2}), 1);
  CHECK(v.to_vector<float>() == std::vector<float>{9, 9});
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
}

TEST_CASE("long rows: float32 sums accumulate in float64 and are identical for any thread count") {
  Tensor x = add(test::random({3, 100003}, DType::Float32, 15), 1000.0);
  Tensor ref = reference(x, {1}, false, ref_sum);
  int threads = num_threads();
  std::vector<Tensor> results;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    results.push_back(sum(x, {1}));
    results.push_back(sum(x));
    results.push_back(var(x, {1}));
    results.push_back(amax(x, {0}));
    results.push_back(mean(x.t(), {0}));  // permuted copy path
  }
  set_num_threads(threads);
  for (size_t i = 5; i < results.size(); ++i) CHECK_CLOSE(results[i], results[i % 5], 0, 0);
  // float64 accumulation: error ~ float32 rounding of the result, not of 1e5 additions.
  CHECK_CLOSE(results[0], ref, 0, 1e-7);
  CHECK_CLOSE(results[1], reference(x, {}, false, ref_sum).reshape({}), 0, 1e-7);
  CHECK_CLOSE(results[2], reference(x, {1}, false, ref_var(1)), 0, 1e-5);
  CHECK_CLOSE(results[4], reference(x, {1}, false, ref_mean), 0, 1e-7);
}

TEST_CASE("column layouts: reduced dims first or in the middle, wider than one column block") {
  // Contiguous inputs whose reduced dims are adjacent but not last are reduced in place as
  // columns; 1100 and 1030 positions span more than one block of columns.
  for (Shape shape : {Shape{37, 1100}, Shape{3, 9, 1030}}) {
    Tensor x = test::random(shape, DType::Float32, 16);
    std::vector<int64_t> dims = shape.size() == 2 ? std::vector<int64_t>{0} : std::vector<int64_t>{1};
    CAPTURE(shape);
    CHECK_CLOSE(sum(x, dims), reference(x, dims, false, ref_sum), 1e-5, 1e-5);
    CHECK_CLOSE(mean(x, dims, true), reference(x, dims, true, ref_mean), 1e-6, 1e-5);
    CHECK_CLOSE(var(x, dims), reference(x, dims, false, ref_var(1)), 1e-6, 1e-5);
    CHECK_CLOSE(amax(x, dims), reference(x, dims, false, ref_max), 0, 0);
    CHECK_CLOSE(amin(x, dims), reference(x, dims, false, ref_min), 0, 0);
    CHECK_CLOSE(argmax(x, dims[0]), reference(x, dims, false, ref_argmax), 0, 0);
    CHECK_CLOSE(argmin(x, dims[0]), reference(x, dims, false, ref_argmin), 0, 0);
  }
  // Ties and NaN in columns: the first index wins, NaN wins argmax and propagates.
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor c = tensor({1, 5, 2, 7, 5, nan, 7, 0, 2}, {3, 3});
  CHECK(argmax(c, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
  CHECK(argmin(c, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 1});
  auto col_max = amax(c, {0}).to_vector<float>();
  CHECK(col_max[0] == 7);
  CHECK(col_max[1] == 5);
  CHECK(std::isnan(col_max[2]));
}

TEST_CASE("extrema with infinities of both signs and NaN, in rows and columns") {
  float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> values(40, 1.0f);
  values[3] = inf, values[17] = -inf;
  Tensor row = tensor(values, {40});
  CHECK(amax(row).item() == inf);
  CHECK(amin(row).item() == -inf);
  CHECK(argmax(row).item<int64_t>() == 3);
  Tensor col = row.reshape({40, 1}).expand({40, 3}).contiguous();
  CHECK(amax(col, {0}).to_vector<float>() == std::vector<float>(3, inf));
  CHECK(amin(col, {0}).to_vector<float>() == std::vector<float>(3, -inf));
  values[30] = nan;
  Tensor with_nan = tensor(values, {40});
  CHECK(std::isnan(amax(with_nan).item()));
  CHECK(std::isnan(amin(with_nan).item()));
  CHECK(argmax(with_nan).item<int64_t>() == 30);
  Tensor nan_col = with_nan.reshape({40, 1}).expand({40, 2}).contiguous();
  CHECK(std::isnan(amax(nan_col, {0}).to_vector<float>()[1]));
}

TEST_CASE("long rows reduce the same way row by row and block by block") {
  // 16 rows: one thread reduces row by row, 8 threads split each row into blocks.
  Tensor x = test::random({16, 20000}, DType::Float32, 17);
  int threads = num_threads();
  set_num_threads(1);
  Tensor by_rows = sum(x, {1}), arg_rows = argmax(x, 1), var_rows = var(x, {1});
  set_num_threads(8);
  Tensor by_blocks = sum(x, {1}), arg_blocks = argmax(x, 1), var_blocks = var(x, {1});
  set_num_threads(threads);
  CHECK_CLOSE(by_rows, by_blocks, 0, 0);
  CHECK_CLOSE(arg_rows, arg_blocks, 0, 0);
  CHECK_CLOSE(var_rows, var_blocks, 0, 0);
  CHECK_CLOSE(arg_rows, reference(x, {1}, false, ref_argmax), 0, 0);
}

TEST_CASE("empty tensors") {
  Tensor e = zeros({0, 3}, DType::Float64);
  CHECK(sum(e, {0}).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(std::isnan(mean(e).item()));
  CHECK(amax(e, {1}).shape() == Shape{0});
  CHECK(argmax(e, 1).shape() == Shape{0});
  CHECK_THROWS_WITH_AS(amax(e, {0}), doctest::Contains("amax: cannot reduce over dim 0, which has size 0"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(amin(e), doctest::Contains("amin: cannot reduce over dim 0, which has size 0"), weft::Error);
  CHECK_THROWS_WITH_AS(argmax(e), doctest::Contains("argmax: cannot take the argmax of an empty tensor"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(max(e, 0), doctest::Contains("max: cannot reduce over dim 0"), weft::Error);
}

TEST_CASE("0-d inputs") {
  Tensor s = scalar_tensor(2.5, DType::Float64);
  CHECK(sum(s).item() == 2.5);
  CHECK(amax(s, {0}).item() == 2.5);
  CHECK(argmax(s).item<int64_t>() == 0);
  CHECK(argmax(s, 0).item<int64_t>() == 0);
  auto [v, i] = max(s, -1);
  CHECK(v.item() == 2.5);
  CHECK(i.item<int64_t>() == 0);
}

TEST_CASE("gradcheck: sum, mean, amax, amin, var, max along a dim") {
  Tensor x = test::leaf({3, 4, 5}, 21);
  Tensor xn = test::noncontiguous(x).requires_grad_();
  for (const Tensor& input : {x, xn}) {
    for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {-1, 0}}) {
      for (bool keepdim : {false, true}) {
        CAPTURE(dims.size());
        CAPTURE(keepdim);
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return sum(in[0], dims, keepdim); }, {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mean(in[0], dims, keepdim); }, {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return amax(in[0], dims, keepdim); }, {input});
        CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return amin(in[0], dims, keepdim); }, {input});
        for (int64_t correction : {0, 1, 2})
          CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return var(in[0], dims, correction, keepdim); },
                          {input});
      }
    }
    for (int64_t d : {0, 2, -2}) {
      CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return max(in[0], d, true).first; }, {input});
      CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return min(in[0], d).first; }, {input});
    }
  }
}

TEST_CASE("amax splits the gradient among ties; max(x, dim) sends it to the first index") {
  Tensor x = tensor(std::vector<double>{1, 3, 3, 2, 5, 0, 5, 5}, {2, 4}).requires_grad_();
  amax(x, {1}).backward(tensor(std::vector<double>{1, 6}, {2}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 0, 2, 0, 2, 2});

  Tensor y = tensor(std::vector<double>{1, 3, 3, 2, 5, 0, 5, 5}, {2, 4}).requires_grad_();
  amin(y).backward();
  CHECK(y.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0, 0, 1, 0, 0});

  Tensor z = tensor(std::vector<double>{1, 3, 3, 2, 5, 0, 5, 5}, {2, 4}).requires_grad_();
  max(z, 1).first.backward(tensor(std::vector<double>{1, 6}, {2}));
  CHECK(z.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0, 6, 0, 0, 0});
  auto [values, indices] = max(z, 1);
  CHECK(values.requires_grad());
  CHECK_FALSE(indices.requires_grad());
}

TEST_CASE("reduction errors") {
  Tensor x = test::random({2, 3}, DType::Float32, 31);
  CHECK_THROWS_WITH_AS(sum(x, {2}), doctest::Contains("sum: dim 2 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(amax(x, {-3}), doctest::Contains("amax: dim -3 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(var(x, {1, -1}), doctest::Contains("var: dim 1 appears more than once"), weft::Error);
  CHECK_THROWS_WITH_AS(argmax(x, 5), doctest::Contains("argmax: dim 5 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(amax(ones({2}, DType::Bool)), doctest::Contains("amax: not defined for bool tensors"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(amax(empty({2}, DType::BFloat16)), doctest::Contains("bfloat16"), weft::Error);
}
