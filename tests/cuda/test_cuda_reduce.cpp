// CUDA reductions, softmax and losses against the CPU kernels on the same inputs: every
// ReduceOp in every path of both layouts (short, warp and block rows, rows split across
// blocks, misaligned rows, column tiles narrow and wide, columns split across blocks),
// integer dtypes, NaN / inf / ties, empty reductions, non-contiguous views, more than
// 2^31 elements; softmax / log_softmax along rows and columns; nll_loss, cross_entropy
// and mse_loss with every option and the bad-target error; gradients through autograd;
// outputs written completely; bitwise determinism: the same op twice gives the same bits.
//
// Tolerances (the GPU sums in another order than the CPU, with the same accumulators):
// - exact: max / min / argmax / argmin (values and indices), integer sums.
// - sums, means, variances: float64 atol 1e-13 * (elements per output) + rtol 1e-12 (the
//   float64 rounding of either order); float32 atol 1e-6 + rtol 1e-6 (both round nearly
//   equal float64 results to float32).
// - softmax, losses and their gradients (CUDA's exp against the CPU's): float64 atol
//   1e-13 + rtol 1e-12; float32 atol 1e-6 + rtol 1e-5.
// NaN must meet NaN, and infinities must be equal.
#include "cuda_test_util.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/loss_kernels.h"
#include "kernels/reduce_kernels.h"
#include "kernels/softmax_kernels.h"

using namespace weft;
using test::difference;
using test::gpu;
using test::on_gpu;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

#define CHECK_MATCH(actual, expected, atol, rtol)                                      \
  do {                                                                                 \
    std::string weft_difference_ = difference((actual), (expected), (atol), (rtol));   \
    CHECK_MESSAGE(weft_difference_.empty(), weft_difference_);                         \
  } while (0)

#define CHECK_EXACT(actual, expected) CHECK_MATCH(actual, expected, 0.0, 0.0)

// Same shape, dtype and bytes (both read back to the host).
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor x = a.detach().to(kCPU).contiguous(), y = b.detach().to(kCPU).contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0;
}

struct Tol {
  double atol, rtol;
};

// Sums, means and variances over `per_output` elements each.
Tol sum_tol(DType dtype, int64_t per_output) {
  if (dtype == DType::Float32) return {1e-6, 1e-6};
  return {1e-13 * static_cast<double>(std::max<int64_t>(per_output, 1)), 1e-12};
}

// Softmax, losses, gradients.
Tol math_tol(DType dtype) { return dtype == DType::Float32 ? Tol{1e-6, 1e-5} : Tol{1e-13, 1e-12}; }

// A shape, the dims reduced, and the kernel path it takes.
struct ReduceCase {
  Shape shape;
  std::vector<int64_t> dims;
  const char* path;
};

const std::vector<ReduceCase> kReduceCases = {
    {{7}, {}, "one short row (4 lanes)"},
    {{8, 1, 5}, {1}, "a size-1 reduced dim: rows of one element"},
    {{2, 3, 4}, {}, "every dim: one row"},
    {{3, 1000}, {1}, "warp rows"},
    {{5, 3000}, {-1}, "block rows"},
    {{2, 70001}, {1}, "rows split across blocks, the second one misaligned"},
    {{1000003}, {}, "one long row split across blocks"},
    {{1000, 5}, {0}, "narrow columns"},
    {{4, 37, 9}, {1}, "columns between outer and post"},
    {{64, 33}, {0}, "a second, partial tile of columns"},
    {{6, 2, 300}, {1}, "two rows per column: tiles wider than a warp"},
    {{100003, 3}, {0}, "columns split across blocks"},
    {{3, 5, 7}, {0, 2}, "dims that are not adjacent: permuted to rows"},
};

Tensor grad_through(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, Device device, uint64_t seed) {
  Tensor leaf = x.detach().to(device).requires_grad_();
  Tensor out = fn(leaf);
  Tensor weights = test::random(out.shape(), out.dtype(), seed).to(device);
  sum(mul(out, weights)).backward();
  return leaf.grad();
}

// Random class indices in [0, c), every third one set to `ignored` when given.
Tensor random_targets(const Shape& shape, int64_t c, uint64_t seed, std::optional<int64_t> ignored = {}) {
  std::vector<double> u = test::random(shape, DType::Float64, seed, 0, static_cast<double>(c)).to_vector<double>();
  std::vector<int64_t> t;
  for (size_t i = 0; i < u.size(); ++i) t.push_back(ignored && i % 3 == 1 ? *ignored : static_cast<int64_t>(u[i]));
  return tensor(t, shape);
}

const Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

}  // namespace

// --- reductions -------------------------------------------------------------------------------

TEST_CASE("reductions match the CPU in every layout and path: float32 and float64") {
  for (const ReduceCase& c : kReduceCases) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      CAPTURE(c.path);
      CAPTURE(c.shape);
      CAPTURE(dtype);
      Tensor x = test::random(c.shape, dtype, 11);
      Tensor xg = on_gpu(x);
      Tensor s = sum(x, c.dims);
      Tol t = sum_tol(dtype, x.numel() / std::max<int64_t>(1, s.numel()));
      CHECK_MATCH(sum(xg, c.dims), s, t.atol, t.rtol);
      CHECK_MATCH(mean(xg, c.dims), mean(x, c.dims), t.atol, t.rtol);
      for (int64_t correction : {0, 1, 2})
        CHECK_MATCH(var(xg, c.dims, correction), var(x, c.dims, correction), t.atol, t.rtol);
      CHECK_EXACT(amax(xg, c.dims), amax(x, c.dims));
      CHECK_EXACT(amin(xg, c.dims), amin(x, c.dims));
      CHECK_EXACT(amax(xg, c.dims, true), amax(x, c.dims, true));
      if (c.dims.size() <= 1) {
        std::optional<int64_t> dim = c.dims.empty() ? std::nullopt : std::optional<int64_t>(c.dims[0]);
        CHECK_EXACT(argmax(xg, dim), argmax(x, dim));
        CHECK_EXACT(argmin(xg, dim), argmin(x, dim));
        if (dim) {
          auto [values, indices] = max(xg, *dim);
          auto [cpu_values, cpu_indices] = max(x, *dim);
          CHECK_EXACT(values, cpu_values);
          CHECK_EXACT(indices, cpu_indices);
          auto [min_values, min_indices] = min(xg, *dim, true);
          auto [cpu_min_values, cpu_min_indices] = min(x, *dim, true);
          CHECK_EXACT(min_values, cpu_min_values);
          CHECK_EXACT(min_indices, cpu_min_indices);
        }
      }
    }
  }
}

TEST_CASE("integer reductions match the CPU exactly: int64, int32, uint8 (sums wrap as on the CPU)") {
  for (const ReduceCase& c : kReduceCases) {
    for (DType dtype : {DType::Int64, DType::Int32, DType::UInt8}) {
      CAPTURE(c.path);
      CAPTURE(c.shape);
      CAPTURE(dtype);
      double lo = dtype == DType::UInt8 ? 0 : -1000, hi = dtype == DType::UInt8 ? 256 : 1000;
      Tensor x = test::random(c.shape, DType::Float64, 12, lo, hi).to(dtype);
      Tensor xg = on_gpu(x);
      CHECK_EXACT(sum(xg, c.dims), sum(x, c.dims));
      CHECK_EXACT(amax(xg, c.dims), amax(x, c.dims));
      CHECK_EXACT(amin(xg, c.dims), amin(x, c.dims));
      if (c.dims.size() <= 1) {
        std::optional<int64_t> dim = c.dims.empty() ? std::nullopt : std::optional<int64_t>(c.dims[0]);
        // Few distinct values: many ties, and the first index must win.
        CHECK_EXACT(argmax(xg, dim), argmax(x, dim));
        CHECK_EXACT(argmin(xg, dim), argmin(x, dim));
        if (dim) {
          auto [values, indices] = max(xg, *dim);
          auto [cpu_values, cpu_indices] = max(x, *dim);
          CHECK_EXACT(values, cpu_values);
          CHECK_EXACT(indices, cpu_indices);
        }
      }
    }
  }
}

TEST_CASE("extrema with NaN, infinities and ties, in rows and columns") {
  const std::vector<double> v = {1,    kNaN, 3,    kNaN,   // NaN propagates; argmax: the first NaN
                                 2,    5,    5,    1,      // ties: the first index
                                 -kInf, -kInf, -kInf, -kInf,  // all -inf
                                 kInf, 1,    kInf, -kInf};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    Tensor rows = tensor(v, {4, 4}).to(dtype);
    Tensor columns = rows.t().contiguous();
    for (auto [x, dim] : {std::pair{rows, int64_t{1}}, std::pair{columns, int64_t{0}}}) {
      Tensor xg = on_gpu(x);
      CHECK_EXACT(amax(xg, {dim}), amax(x, {dim}));
      CHECK_EXACT(amin(xg, {dim}), amin(x, {dim}));
      CHECK_EXACT(argmax(xg, dim), argmax(x, dim));
      CHECK_EXACT(argmin(xg, dim), argmin(x, dim));
      CHECK(argmax(xg, dim).to(kCPU).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0, 0});
      CHECK(argmin(xg, dim).to(kCPU).to_vector<int64_t>() == std::vector<int64_t>{1, 3, 0, 3});
      auto [values, indices] = max(xg, dim);
      auto [cpu_values, cpu_indices] = max(x, dim);
      CHECK_EXACT(values, cpu_values);
      CHECK_EXACT(indices, cpu_indices);
      CHECK_MATCH(sum(xg, {dim}), sum(x, {dim}), 0.0, 0.0);
    }
  }
  // Long rows and columns (split across blocks): a tie between two segments, then a NaN
  // late in the row.
  const int64_t n = 300001;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    std::vector<double> row = test::random({n}, DType::Float64, 13).to_vector<double>();
    row[7] = row[250000] = 100;
    row[11] = row[260000] = -100;
    std::vector<double> with_nan = row;
    with_nan[123457] = kNaN;
    std::vector<double> both = row;
    both.insert(both.end(), with_nan.begin(), with_nan.end());
    Tensor x = tensor(both, {2, n}).to(dtype);
    for (auto [input, dim] : {std::pair{x, int64_t{1}}, std::pair{x.t().contiguous(), int64_t{0}}}) {
      Tensor xg = on_gpu(input);
      CHECK(argmax(xg, dim).to(kCPU).to_vector<int64_t>() == std::vector<int64_t>{7, 123457});
      CHECK(argmin(xg, dim).to(kCPU).to_vector<int64_t>() == std::vector<int64_t>{11, 123457});
      CHECK_EXACT(amax(xg, {dim}), amax(input, {dim}));
      CHECK_EXACT(amin(xg, {dim}), amin(input, {dim}));
      auto [values, indices] = min(xg, dim);
      auto [cpu_values, cpu_indices] = min(input, dim);
      CHECK_EXACT(values, cpu_values);
      CHECK_EXACT(indices, cpu_indices);
    }
  }
}

TEST_CASE("empty reductions: sums of nothing are 0, means and variances NaN, as on the CPU") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
    for (const auto& params : {std::pair{Shape{0, 3}, std::vector<int64_t>{0}},
                               std::pair{Shape{3, 0}, std::vector<int64_t>{1}},
                               std::pair{Shape{0}, std::vector<int64_t>{}},
                               std::pair{Shape{2, 0, 4}, std::vector<int64_t>{1}}}) {
      const Shape& shape = params.first;
      const std::vector<int64_t>& dims = params.second;
      CAPTURE(dtype);
      CAPTURE(shape);
      Tensor x = zeros(shape, dtype), xg = on_gpu(x);
      CHECK_EXACT(sum(xg, dims), sum(x, dims));
      CHECK_EXACT(mean(xg, dims), mean(x, dims));
      CHECK_EXACT(var(xg, dims), var(x, dims));
      CHECK_EXACT(var(xg, dims, -1), var(x, dims, -1));
    }
  }
  // No outputs at all: nothing to launch.
  Tensor x = zeros({0, 5}), xg = on_gpu(x);
  CHECK(amax(xg, {1}).shape() == Shape{0});
  CHECK(argmax(xg, 1).shape() == Shape{0});
  CHECK(sum(xg, {1}).shape() == Shape{0});
}

TEST_CASE("non-contiguous and misaligned inputs; the order does not depend on alignment") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    Tol t = sum_tol(dtype, 50);
    Tensor x = test::random({40, 50}, dtype, 14);
    Tensor xg = on_gpu(x);
    for (auto [cpu, dev] : {std::pair{test::noncontiguous(x), test::noncontiguous(xg)}, std::pair{x.t(), xg.t()},
                            std::pair{x.slice(1, 1, 50, 3), xg.slice(1, 1, 50, 3)}}) {
      for (int64_t dim : {0, 1}) {
        CHECK_MATCH(sum(dev, {dim}), sum(cpu, {dim}), t.atol, t.rtol);
        CHECK_MATCH(var(dev, {dim}), var(cpu, {dim}), t.atol, t.rtol);
        CHECK_EXACT(argmax(dev, dim), argmax(cpu, dim));
        CHECK_EXACT(amin(dev, {dim}), amin(cpu, {dim}));
      }
    }
    // Contiguous views one element past a 16-byte boundary read their packs element by
    // element, in the same order: bitwise the result of an aligned copy.
    Tensor big = on_gpu(test::random({1000004}, dtype, 15));
    Tensor view = big.slice(0, 1, 1000004);
    CHECK(bitwise_equal(sum(view), sum(view.clone())));
    CHECK(bitwise_equal(var(view), var(view.clone())));
    CHECK_MATCH(sum(view), sum(view.to(kCPU)), sum_tol(dtype, 1000003).atol, sum_tol(dtype, 1000003).rtol);
    Tensor rows = big.slice(0, 1, 1 + 7 * 2003).view({7, 2003});
    CHECK(bitwise_equal(sum(rows, {1}), sum(rows.clone(), {1})));
    CHECK(bitwise_equal(argmax(rows, 1), argmax(rows.clone(), 1)));
  }
}

TEST_CASE("more than 2^31 elements: 64-bit indices in a long row") {
  const int64_t n = (int64_t{1} << 31) + 100, at = (int64_t{1} << 31) + 50;
  Tensor x = zeros({n}, TensorOptions(DType::UInt8, gpu()));
  x.slice(0, at, at + 1).copy_(full({1}, 7, TensorOptions(DType::UInt8, gpu())));
  CHECK(argmax(x).item<int64_t>() == at);
  CHECK(amax(x).item<int64_t>() == 7);
  CHECK(sum(x).item<int64_t>() == 7);
}

TEST_CASE("reduction gradients through autograd match the CPU's") {
  std::vector<std::function<Tensor(const Tensor&)>> fns = {
      [](const Tensor& v) { return sum(v, {1}); },
      [](const Tensor& v) { return mean(v, {0}); },
      [](const Tensor& v) { return var(v, {1}); },
      [](const Tensor& v) { return var(v, {0}, 0); },
      [](const Tensor& v) { return amax(v, {1}); },
      [](const Tensor& v) { return amin(v, {0}); },
      [](const Tensor& v) { return max(v, 1).first; },
      [](const Tensor& v) { return min(v, 0).first; },
      [](const Tensor& v) { return mean(v); },
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    // Values rounded to halves: ties for amax / amin to share the gradient among.
    Tensor halves = mul(test::random({6, 70}, DType::Float64, 16, -8, 8).to(DType::Int64).to(DType::Float64), 0.5);
    Tensor x = halves.to(dtype);
    Tol t = math_tol(dtype);
    for (size_t i = 0; i < fns.size(); ++i) {
      CAPTURE(dtype);
      CAPTURE(i);
      CHECK_MATCH(grad_through(fns[i], x, gpu(), 17), grad_through(fns[i], x, kCPU, 17), t.atol, t.rtol);
    }
  }
}

TEST_CASE("reduction kernels write every output of a poisoned buffer") {
  struct Layout {
    int64_t outer, inner, post;
  };
  for (Layout l : {Layout{5, 7, 1}, Layout{3, 5000, 1}, Layout{1, 200003, 1}, Layout{4, 37, 9}, Layout{1, 100003, 3}}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::ArgMin, ReduceOp::Var}) {
      CAPTURE(l.outer);
      CAPTURE(l.inner);
      CAPTURE(l.post);
      CAPTURE(static_cast<int>(op));
      Tensor x = test::random({l.outer * l.inner * l.post}, DType::Float32, 18);
      bool arg = op == ReduceOp::ArgMin;
      DType out_dtype = arg ? DType::Int64 : DType::Float32;
      Tensor out_cpu = test::poisoned({l.outer * l.post}, out_dtype, kCPU);
      Tensor values_cpu = arg ? test::poisoned({l.outer * l.post}, DType::Float32, kCPU) : Tensor();
      reduce_stub(kCPU, op, x, l.outer, l.inner, l.post, out_cpu, values_cpu, 1.0);
      Tensor out_gpu = test::poisoned({l.outer * l.post}, out_dtype, gpu());
      Tensor values_gpu = arg ? test::poisoned({l.outer * l.post}, DType::Float32, gpu()) : Tensor();
      reduce_stub(gpu(), op, on_gpu(x), l.outer, l.inner, l.post, out_gpu, values_gpu, 1.0);
      Tol t = sum_tol(DType::Float32, l.inner);
      CHECK_MATCH(out_gpu, out_cpu, t.atol, t.rtol);
      if (arg) CHECK_EXACT(values_gpu, values_cpu);
    }
  }
}

TEST_CASE("reductions are bitwise repeatable on the GPU") {
  Tensor row = on_gpu(test::random({1000003}, DType::Float32, 19));
  Tensor columns = on_gpu(test::random({100003, 3}, DType::Float64, 20));
  Tensor rows = on_gpu(test::random({64, 5000}, DType::Float32, 21));
  std::vector<std::function<Tensor()>> runs = {
      [&] { return sum(row); },           [&] { return var(row); },
      [&] { return argmax(row); },        [&] { return mean(columns, {0}); },
      [&] { return var(columns, {0}); },  [&] { return sum(rows, {1}); },
      [&] { return sum(rows, {0}); },     [&] { return max(rows, 0).second; },
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(runs[i](), runs[i]()));
  }
}

// --- softmax ------------------------------------------------------------------------------------

TEST_CASE("softmax and log_softmax match the CPU in every layout, forward and backward") {
  struct Case {
    Shape shape;
    int64_t dim;
    const char* path;
  };
  const std::vector<Case> cases = {
      {{7, 10}, 1, "rows of 4 lanes"},       {{5, 300}, 1, "warp rows"},
      {{3, 5000}, -1, "block rows"},         {{9}, 0, "one row"},
      {{1, 1, 9}, 2, "one row in 3-d"},      {{4, 37, 9}, 1, "columns"},
      {{2, 50, 100}, 1, "warp-wide tiles"},  {{1000, 3}, 0, "narrow tiles of long columns"},
      {{6, 2, 300}, 1, "two-row tiles"},     {{4, 1}, 1, "rows of one element"},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      for (bool log : {false, true}) {
        CAPTURE(c.path);
        CAPTURE(c.shape);
        CAPTURE(dtype);
        CAPTURE(log);
        Tol t = math_tol(dtype);
        Tensor x = mul(test::random(c.shape, dtype, 22), 3.0);
        auto fn = [&](const Tensor& v) { return log ? log_softmax(v, c.dim) : softmax(v, c.dim); };
        CHECK_MATCH(fn(on_gpu(x)), fn(x), t.atol, t.rtol);
        CHECK_MATCH(fn(test::noncontiguous(on_gpu(x))), fn(x), t.atol, t.rtol);
        CHECK_MATCH(grad_through(fn, x, gpu(), 23), grad_through(fn, x, kCPU, 23), t.atol, t.rtol);
        CHECK(bitwise_equal(fn(on_gpu(x)), fn(on_gpu(x))));
        CHECK(bitwise_equal(grad_through(fn, x, gpu(), 23), grad_through(fn, x, gpu(), 23)));
      }
    }
  }
}

TEST_CASE("softmax of NaN, infinities and large values, in rows and columns, as on the CPU") {
  const std::vector<double> v = {1,     kNaN,  2,      // NaN: the whole position
                                 kInf,  1,     0,      // +inf: NaN (inf - inf)
                                 -kInf, -kInf, -kInf,  // only -inf: NaN
                                 -kInf, 0,     1,      // -inf among finite values: 0
                                 1000,  1001,  1002};  // large: stable
  for (DType dtype : {DType::Float32, DType::Float64}) {
    Tol t = math_tol(dtype);
    Tensor rows = tensor(v, {5, 3}).to(dtype);
    for (const auto& x_dim : {std::pair{rows, int64_t{1}}, std::pair{rows.t().contiguous(), int64_t{0}}}) {
      const Tensor& x = x_dim.first;
      const int64_t dim = x_dim.second;
      CAPTURE(dtype);
      CAPTURE(dim);
      CHECK_MATCH(softmax(on_gpu(x), dim), softmax(x, dim), t.atol, t.rtol);
      CHECK_MATCH(log_softmax(on_gpu(x), dim), log_softmax(x, dim), t.atol, t.rtol);
    }
  }
}

TEST_CASE("softmax kernels write every element of a poisoned output") {
  for (auto [outer, n, post] : {std::tuple{int64_t{3}, int64_t{10}, int64_t{1}}, std::tuple{int64_t{2}, int64_t{3000}, int64_t{1}},
                                std::tuple{int64_t{3}, int64_t{7}, int64_t{45}}}) {
    for (bool log : {false, true}) {
      Tensor x = test::random({outer * n * post}, DType::Float64, 24);
      Tensor out = test::poisoned({outer * n * post}, DType::Float64, gpu());
      softmax_stub(gpu(), on_gpu(x), out, outer, n, post, log);
      Tensor expected = test::poisoned({outer * n * post}, DType::Float64, kCPU);
      softmax_stub(kCPU, x, expected, outer, n, post, log);
      CHECK_MATCH(out, expected, 1e-13, 1e-12);
      Tensor g = test::random({outer * n * post}, DType::Float64, 25);
      Tensor grad_in = test::poisoned({outer * n * post}, DType::Float64, gpu());
      softmax_backward_stub(gpu(), on_gpu(g), on_gpu(expected), grad_in, outer, n, post, log);
      Tensor expected_grad = test::poisoned({outer * n * post}, DType::Float64, kCPU);
      softmax_backward_stub(kCPU, g, expected, expected_grad, outer, n, post, log);
      CHECK_MATCH(grad_in, expected_grad, 1e-13, 1e-12);
    }
  }
}

// --- losses -------------------------------------------------------------------------------------

namespace {

struct ClassCase {
  Shape input, target;
  const char* path;
};

const std::vector<ClassCase> kClassCases = {
    {{6, 5}, {6}, "rows of 4 lanes"},
    {{64, 10}, {64}, "rows of 4 lanes, many"},
    {{16, 100}, {16}, "warp rows"},
    {{4, 3000}, {4}, "block rows"},
    {{3, 4, 7}, {3, 7}, "positions at stride post"},
    {{2, 3, 4, 5}, {2, 4, 5}, "positions at stride post, 4-d"},
    {{5}, {}, "one position"},
};

}  // namespace

TEST_CASE("nll_loss and cross_entropy match the CPU: reductions, weights, ignore_index, smoothing") {
  for (const ClassCase& l : kClassCases) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      Tol t = math_tol(dtype);
      const int64_t class_dim = l.input.size() == 1 ? 0 : 1;
      const int64_t c = l.input[class_dim];
      Tensor logits = mul(test::random(l.input, dtype, 31), 2.0);
      Tensor lp = log_softmax(logits, class_dim);
      Tensor w = test::random({c}, dtype, 32, 0.5, 2.0);
      for (int64_t ignore : {int64_t{-100}, int64_t{1}}) {
        Tensor target = random_targets(l.target, c, 33, l.target.empty() ? std::nullopt : std::optional(ignore));
        Tensor tg = on_gpu(target);
        for (Reduction r : kReductions) {
          for (bool weighted : {false, true}) {
            CAPTURE(l.path);
            CAPTURE(l.input);
            CAPTURE(dtype);
            CAPTURE(ignore);
            CAPTURE(static_cast<int>(r));
            CAPTURE(weighted);
            Tensor wc = weighted ? w : Tensor(), wg = weighted ? on_gpu(w) : Tensor();
            auto nll = [&](const Tensor& v) {
              return nll_loss(v, v.device() == kCPU ? target : tg, r, ignore, v.device() == kCPU ? wc : wg);
            };
            CHECK_MATCH(nll(on_gpu(lp)), nll(lp), t.atol, t.rtol);
            CHECK_MATCH(grad_through(nll, lp, gpu(), 34), grad_through(nll, lp, kCPU, 34), t.atol, t.rtol);
            for (double smoothing : {0.0, 0.2}) {
              CAPTURE(smoothing);
              auto ce = [&](const Tensor& v) {
                return cross_entropy(v, v.device() == kCPU ? target : tg, r, ignore, v.device() == kCPU ? wc : wg,
                                     smoothing);
              };
              CHECK_MATCH(ce(on_gpu(logits)), ce(logits), t.atol, t.rtol);
              CHECK_MATCH(ce(test::noncontiguous(on_gpu(logits))), ce(logits), t.atol, t.rtol);
              CHECK_MATCH(grad_through(ce, logits, gpu(), 35), grad_through(ce, logits, kCPU, 35), t.atol, t.rtol);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy: large logits, NaN and inf, and every target ignored") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    Tol t = math_tol(dtype);
    Tensor logits = tensor(std::vector<double>{1000, -1000, 0, 500, 501, 502, 1, kNaN, 2, kInf, 0, 1}, {4, 3}).to(dtype);
    Tensor target = tensor(std::vector<int64_t>{0, 2, 0, 1});
    CHECK_MATCH(cross_entropy(on_gpu(logits), on_gpu(target), Reduction::None),
                cross_entropy(logits, target, Reduction::None), t.atol, t.rtol);
    Tensor columns = logits.t().contiguous().view({1, 3, 4});
    Tensor column_target = target.view({1, 4});
    CHECK_MATCH(cross_entropy(on_gpu(columns), on_gpu(column_target), Reduction::None),
                cross_entropy(columns, column_target, Reduction::None), t.atol, t.rtol);
    Tensor all_ignored = tensor(std::vector<int64_t>{-100, -100, -100, -100});
    CHECK(std::isnan(cross_entropy(on_gpu(logits), on_gpu(all_ignored)).item()));
    CHECK(std::isnan(nll_loss(on_gpu(logits), on_gpu(all_ignored)).item()));
    CHECK(nll_loss(on_gpu(logits), on_gpu(all_ignored), Reduction::Sum).item() == 0.0);
  }
}

// The CPU's error, raised at the next synchronisation (the loss's item() here) rather than
// by the op (Note [Device-side errors]), with the position flat.
TEST_CASE("out-of-range targets on the GPU: the CPU's error, naming the first bad position") {
  Tensor x = on_gpu(test::random({4, 3}, DType::Float32, 41));
  CHECK_THROWS_WITH_AS(cross_entropy(x, on_gpu(tensor(std::vector<int64_t>{0, 2, 3, 7}))).item(),
                       doctest::Contains("cross_entropy: target value 3 at flat position 2 is out of range for 3 "
                                         "classes (expected 0 .. 2, or ignore_index -100)"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(nll_loss(x, on_gpu(tensor(std::vector<int64_t>{0, -1, 3, 1}))).item(),
                       doctest::Contains("nll_loss: target value -1 at flat position 1 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(
      nll_loss(on_gpu(zeros({2, 3, 2})), on_gpu(tensor(std::vector<int64_t>{0, 1, -1, 2}, {2, 2}))).item(),
      doctest::Contains("nll_loss: target value -1 at flat position 2 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(
      cross_entropy(on_gpu(zeros({2, 3, 2})), on_gpu(tensor(std::vector<int64_t>{0, 1, 2, 3}, {2, 2}))).item(),
      doctest::Contains("cross_entropy: target value 3 at flat position 3 is out of range"), weft::Error);
  // Block rows, and many bad targets: the smallest position wins, whatever the timing.
  CHECK_THROWS_WITH_AS(
      cross_entropy(on_gpu(zeros({3, 3000})), on_gpu(tensor(std::vector<int64_t>{5, 3000, -7}))).item(),
      doctest::Contains("target value 3000 at flat position 1"), weft::Error);
  std::vector<int64_t> many(20000, 1);
  for (size_t i = 4321; i < many.size(); i += 7) many[i] = 10 + static_cast<int64_t>(i);
  for (int repeat = 0; repeat < 3; ++repeat) {
    CHECK_THROWS_WITH_AS(cross_entropy(on_gpu(zeros({20000, 10})), on_gpu(tensor(many))).item(),
                         doctest::Contains("target value 4331 at flat position 4321"), weft::Error);
    CHECK_THROWS_WITH_AS(nll_loss(on_gpu(zeros({20000, 10})), on_gpu(tensor(many))).item(),
                         doctest::Contains("target value 4331 at flat position 4321"), weft::Error);
  }
  // Raised once: the GPU goes on, and the next loss is fine.
  CHECK(std::isfinite(cross_entropy(x, on_gpu(tensor(std::vector<int64_t>{0, 2, 1, 0}))).item()));
}

TEST_CASE("loss kernels write every element of poisoned outputs") {
  for (const ClassCase& l : {kClassCases[1], kClassCases[3], kClassCases[4]}) {
    CAPTURE(l.path);
    const int64_t c = l.input[1], n = l.input[0], post = l.input.numel() / (n * c), positions = n * post;
    Tensor logits = test::random(l.input, DType::Float64, 42);
    Tensor target = random_targets({positions}, c, 43, int64_t{2});
    Tensor w = test::random({c}, DType::Float64, 44, 0.5, 2.0);
    auto outputs = [&](Device d) {
      return std::vector<Tensor>{test::poisoned({positions}, DType::Float64, d),
                                 test::poisoned({positions}, DType::Float64, d),
                                 test::poisoned({positions}, DType::Float64, d)};
    };
    std::vector<Tensor> cpu = outputs(kCPU), dev = outputs(gpu());
    CHECK(cross_entropy_stub(kCPU, logits, target, w, n, c, post, 2, 0.1, cpu[0], cpu[1], cpu[2]) == -1);
    CHECK(cross_entropy_stub(gpu(), on_gpu(logits), on_gpu(target), on_gpu(w), n, c, post, 2, 0.1, dev[0], dev[1],
                             dev[2]) == -1);
    for (int i = 0; i < 3; ++i) CHECK_MATCH(dev[i], cpu[i], 1e-13, 1e-12);
    Tensor grad = test::random({positions}, DType::Float64, 45);
    Tensor expected = test::poisoned(l.input, DType::Float64, kCPU), actual = test::poisoned(l.input, DType::Float64, gpu());
    cross_entropy_backward_stub(kCPU, grad, logits, target, w, cpu[2], n, c, post, 2, 0.1, expected);
    cross_entropy_backward_stub(gpu(), on_gpu(grad), on_gpu(logits), on_gpu(target), on_gpu(w), dev[2], n, c, post, 2,
                                0.1, actual);
    CHECK_MATCH(actual, expected, 1e-13, 1e-12);
    std::vector<Tensor> nll_cpu = outputs(kCPU), nll_dev = outputs(gpu());
    CHECK(nll_loss_stub(kCPU, logits, target, w, n, c, post, 2, nll_cpu[0], nll_cpu[1]) == -1);
    CHECK(nll_loss_stub(gpu(), on_gpu(logits), on_gpu(target), on_gpu(w), n, c, post, 2, nll_dev[0], nll_dev[1]) == -1);
    CHECK_MATCH(nll_dev[0], nll_cpu[0], 1e-13, 1e-12);
    CHECK_MATCH(nll_dev[1], nll_cpu[1], 0.0, 0.0);
    expected = test::poisoned(l.input, DType::Float64, kCPU);
    actual = test::poisoned(l.input, DType::Float64, gpu());
    nll_loss_backward_stub(kCPU, grad, target, w, n, c, post, 2, expected);
    nll_loss_backward_stub(gpu(), on_gpu(grad), on_gpu(target), on_gpu(w), n, c, post, 2, actual);
    CHECK_MATCH(actual, expected, 1e-13, 1e-12);
  }
}

TEST_CASE("mse_loss matches the CPU: reductions, long and empty inputs, gradients in both inputs") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (Shape shape : {Shape{5, 7}, Shape{1000003}, Shape{0}}) {
      CAPTURE(dtype);
      CAPTURE(shape);
      Tensor a = test::random(shape, dtype, 51), b = test::random(shape, dtype, 52);
      Tol t = sum_tol(dtype, shape.numel());
      for (Reduction r : kReductions) {
        CAPTURE(static_cast<int>(r));
        CHECK_MATCH(mse_loss(on_gpu(a), on_gpu(b), r), mse_loss(a, b, r), t.atol, t.rtol);
        CHECK_MATCH(mse_loss(test::noncontiguous(on_gpu(a)), on_gpu(b), r), mse_loss(a, b, r), t.atol, t.rtol);
        if (shape.numel() == 0) continue;
        auto grads = [&](Device d) {
          Tensor x = a.detach().to(d).requires_grad_(), y = b.detach().to(d).requires_grad_();
          Tensor out = mse_loss(x, y, r);
          if (r == Reduction::None) sum(mul(out, test::random(shape, dtype, 53).to(d))).backward();
          else out.backward();
          return std::pair{x.grad(), y.grad()};
        };
        auto [ga, gb] = grads(gpu());
        auto [ca, cb] = grads(kCPU);
        Tol g = math_tol(dtype);
        CHECK_MATCH(ga, ca, g.atol, g.rtol);
        CHECK_MATCH(gb, cb, g.atol, g.rtol);
      }
    }
  }
}

TEST_CASE("losses are bitwise repeatable on the GPU") {
  Tensor logits = on_gpu(mul(test::random({512, 1000}, DType::Float32, 61), 3.0));
  Tensor target = on_gpu(random_targets({512}, 1000, 62, int64_t{0}));
  Tensor w = on_gpu(test::random({1000}, DType::Float32, 63, 0.5, 2.0));
  auto ce = [&] {
    Tensor x = logits.detach().requires_grad_();
    Tensor loss = cross_entropy(x, target, Reduction::Mean, 0, w, 0.1);
    loss.backward();
    return std::pair{loss, x.grad()};
  };
  auto [loss1, grad1] = ce();
  auto [loss2, grad2] = ce();
  CHECK(bitwise_equal(loss1, loss2));
  CHECK(bitwise_equal(grad1, grad2));
  Tensor a = on_gpu(test::random({1000003}, DType::Float32, 64)), b = on_gpu(test::random({1000003}, DType::Float32, 65));
  CHECK(bitwise_equal(mse_loss(a, b), mse_loss(a, b)));
  CHECK(bitwise_equal(mse_loss(a, b, Reduction::Sum), mse_loss(a, b, Reduction::Sum)));
}
