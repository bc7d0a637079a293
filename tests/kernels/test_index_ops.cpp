// index_select / gather / scatter_add / one_hot / embedding: forward against hand-computed
// values and naive loops, gradients (gradcheck, repeated indices, padding_idx),
// determinism of the scatter-add backward, and error texts.
#include <numeric>

#include "test_util.h"

using namespace weft;
using test::leaf;
using test::noncontiguous;
using test::random;

namespace {

// Row-major strides of a shape, for the naive references.
std::vector<int64_t> row_major(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t d = s.size() - 2; d >= 0; --d) st[d] = st[d + 1] * s[d + 1];
  return st;
}

// Multi-index of flat position p in shape s.
std::vector<int64_t> coords_of(int64_t p, const Shape& s) {
  std::vector<int64_t> c(s.size());
  for (int64_t d = s.size() - 1; d >= 0; --d) c[d] = p % s[d], p /= s[d];
  return c;
}

int64_t flat_of(const std::vector<int64_t>& c, const Shape& s) {
  auto st = row_major(s);
  int64_t p = 0;
  for (size_t d = 0; d < c.size(); ++d) p += c[d] * st[d];
  return p;
}

// torch.gather, written as the definition: out[p] = x[p with dim replaced by index[p]].
std::vector<double> naive_gather(const Tensor& x, int64_t dim, const Tensor& index) {
  auto xv = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  std::vector<double> out(iv.size());
  for (size_t p = 0; p < iv.size(); ++p) {
    auto c = coords_of(p, index.shape());
    c[dim] = iv[p];
    out[p] = xv[flat_of(c, x.shape())];
  }
  return out;
}

std::vector<double> naive_scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  auto out = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  auto sv = src.to_vector<double>();
  for (size_t p = 0; p < iv.size(); ++p) {
    auto c = coords_of(p, index.shape());
    double v = sv[flat_of(c, src.shape())];
    c[dim] = iv[p];
    out[flat_of(c, x.shape())] += v;
  }
  return out;
}

Tensor as_tensor(const std::vector<double>& v, const Shape& s) { return tensor(v, s); }

}  // namespace

// --- index_select ---------------------------------------------------------------------

TEST_CASE("index_select: hand-computed values, repeated and 0-d indices") {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor out = index_select(x, 0, tensor(std::vector<int64_t>{2, 0, 2}));
  CHECK(out.shape() == Shape{3, 2});
  CHECK(out.to_vector<float>() == std::vector<float>{5, 6, 1, 2, 5, 6});
  out = index_select(x, -1, tensor(std::vector<int64_t>{1}));
  CHECK(out.shape() == Shape{3, 1});
  CHECK(out.to_vector<float>() == std::vector<float>{2, 4, 6});
  out = index_select(x, 1, scalar_tensor(0, DType::Int64));
  CHECK(out.shape() == Shape{3, 1});
  CHECK(out.to_vector<float>() == std::vector<float>{1, 3, 5});
  out = index_select(x, 0, zeros({0}, DType::Int64));
  CHECK(out.shape() == Shape{0, 2});
  out = index_select(scalar_tensor(7.0), 0, tensor(std::vector<int64_t>{0}));
  CHECK(out.dim() == 0);
  CHECK(out.item() == 7.0);
}

TEST_CASE("index_select: naive reference on every dim, float64 / float32 / int64, non-contiguous") {
  Generator gen(101);
  for (DType dtype : {DType::Float64, DType::Float32, DType::Int64}) {
    Tensor base = dtype == DType::Int64 ? randint(-50, 50, {4, 5, 3}, DType::Int64, &gen)
                                        : random({4, 5, 3}, dtype, 102);
    for (bool contiguous : {true, false}) {
      Tensor x = contiguous ? base : noncontiguous(base);
      for (int64_t dim = -3; dim < 3; ++dim) {
        const int64_t d = dim < 0 ? dim + 3 : dim;
        Tensor index = randint(0, x.shape()[d], {7}, DType::Int64, &gen);
        Tensor out = index_select(x, dim, index);
        REQUIRE(out.dtype() == dtype);
        // index_select is gather with the index broadcast along the other dims.
        Shape s = x.shape();
        s[d] = 7;
        Shape view_shape{1, 1, 1};
        view_shape[d] = 7;
        Tensor full_index = index.view(view_shape).expand(s).contiguous();
        CHECK_CLOSE(out, as_tensor(naive_gather(x, d, full_index), s), 0, 0);
      }
    }
  }
}

TEST_CASE("index_select gradcheck: repeated indices accumulate, non-contiguous input") {
  Tensor index = tensor(std::vector<int64_t>{1, 3, 1, 1, 0});
  Tensor w = random({2, 5, 3}, DType::Float64, 111);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mul(index_select(in[0], 1, index), w); },
                  (std::vector<Tensor>{leaf({2, 4, 3}, 112)}));
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return index_select(in[0], -1, index); },
                  (std::vector<Tensor>{noncontiguous(random({3, 4}, DType::Float64, 113)).requires_grad_()}));
  Tensor x = leaf({4}, 114);
  sum(index_select(x, 0, index)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 3, 0, 1});
}

// --- gather / scatter_add ---------------------------------------------------------------

TEST_CASE("gather: the PyTorch documentation example, then a naive reference") {
  Tensor t = tensor({1, 2, 3, 4}, {2, 2});
  Tensor out = gather(t, 1, tensor(std::vector<int64_t>{0, 0, 1, 0}, {2, 2}));
  CHECK(out.to_vector<float>() == std::vector<float>{1, 1, 4, 3});

  Generator gen(121);
  for (DType dtype : {DType::Float64, DType::Int64}) {
    Tensor base = dtype == DType::Int64 ? randint(-9, 9, {4, 5, 6}, DType::Int64, &gen)
                                        : random({4, 5, 6}, dtype, 122);
    for (bool contiguous : {true, false}) {
      Tensor x = contiguous ? base : noncontiguous(base);
      for (int64_t dim = -3; dim < 3; ++dim) {
        const int64_t d = dim < 0 ? dim + 3 : dim;
        // The index is smaller than x off the gather dim and larger along it.
        Shape s{3, 4, 5};
        s[d] = 8;
        Tensor index = randint(0, x.shape()[d], s, DType::Int64, &gen);
        Tensor idx = contiguous ? index : noncontiguous(index);
        Tensor out = gather(x, dim, idx);
        REQUIRE(out.shape() == s);
        CHECK_CLOSE(out, as_tensor(naive_gather(x, d, index), s), 0, 0);
      }
    }
  }
  CHECK(gather(scalar_tensor(2.5), 0, scalar_tensor(0, DType::Int64)).item() == 2.5);
}

TEST_CASE("gather gradcheck: repeated indices, non-contiguous input") {
  Tensor index = tensor(std::vector<int64_t>{0, 0, 2, 1, 2, 2}, {2, 3});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return gather(in[0], 1, index); },
                  (std::vector<Tensor>{leaf({2, 4}, 131)}));
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return gather(in[0], 0, index); },
                  (std::vector<Tensor>{noncontiguous(random({3, 3}, DType::Float64, 132)).requires_grad_()}));
  Tensor x = leaf({2, 4}, 133);
  sum(gather(x, 1, index)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 0, 1, 0, 0, 1, 2, 0});
}

TEST_CASE("scatter_add: hand-computed, naive reference, src larger than index") {
  Tensor x = zeros({2, 3});
  Tensor index = tensor(std::vector<int64_t>{0, 2, 0, 1, 1, 1}, {2, 3});
  Tensor src = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(scatter_add(x, 1, index, src).to_vector<float>() == std::vector<float>{4, 0, 2, 0, 15, 0});
  CHECK(x.to_vector<float>() == std::vector<float>(6, 0.0f));  // out of place

  Generator gen(141);
  for (int64_t dim = -3; dim < 3; ++dim) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Tensor base = random({4, 5, 6}, DType::Float64, 142);
    Shape s{3, 4, 5};
    s[d] = 9;
    Tensor idx = randint(0, base.shape()[d], s, DType::Int64, &gen);
    Shape src_shape{4, 5, 6};
    src_shape[d] = 10;
    Tensor source = noncontiguous(random(src_shape, DType::Float64, 143));
    Tensor out = scatter_add(noncontiguous(base), dim, idx, source);
    CHECK_CLOSE(out, as_tensor(naive_scatter_add(base, d, idx, source), base.shape()), 1e-12, 1e-12);
  }
  Tensor ints = scatter_add(arange(4), 0, tensor(std::vector<int64_t>{3, 3}), tensor(std::vector<int64_t>{5, 6}));
  CHECK(ints.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 14});
}

TEST_CASE("scatter_add gradcheck: input and src, src larger than index") {
  Tensor index = tensor(std::vector<int64_t>{1, 1, 0, 2, 1, 1}, {2, 3});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, index, in[1]); },
                  (std::vector<Tensor>{leaf({3, 3}, 151), leaf({3, 4}, 152)}));
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return scatter_add(in[0], 1, index, in[1]); },
                  (std::vector<Tensor>{random({2, 4}, DType::Float64, 153),
                                       noncontiguous(random({2, 3}, DType::Float64, 154)).requires_grad_()}));
}

// --- one_hot / embedding ------------------------------------------------------------------

TEST_CASE("one_hot: given and inferred class counts, any index shape") {
  Tensor out = one_hot(tensor(std::vector<int64_t>{0, 2, 1}));
  CHECK(out.dtype() == DType::Int64);
  CHECK(out.shape() == Shape{3, 3});
  CHECK(out.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 1, 0});
  out = one_hot(tensor(std::vector<int64_t>{1, 0, 3, 3}, {2, 2}), 5);
  CHECK(out.shape() == Shape{2, 2, 5});
  CHECK(out.to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  Tensor index = noncontiguous(tensor(std::vector<int64_t>{4, 0, 2, 1, 3, 3}, {2, 3}));
  out = one_hot(index, 6);
  auto iv = index.to_vector<int64_t>();
  auto ov = out.to_vector<int64_t>();
  for (size_t p = 0; p < iv.size(); ++p)
    for (int64_t c = 0; c < 6; ++c) CHECK(ov[p * 6 + c] == (c == iv[p] ? 1 : 0));
  CHECK(one_hot(scalar_tensor(2, DType::Int64), 4).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 0});
  CHECK(one_hot(zeros({0}, DType::Int64), 3).shape() == Shape{0, 3});
}

TEST_CASE("embedding: forward by rows, any index shape, non-contiguous weight") {
  Tensor weight = random({6, 4}, DType::Float32, 161);
  Tensor indices = tensor(std::vector<int64_t>{5, 0, 5, 2, 3, 1}, {2, 3});
  Tensor out = embedding(weight, indices);
  REQUIRE(out.shape() == Shape{2, 3, 4});
  auto iv = indices.to_vector<int64_t>();
  for (int64_t p = 0; p < 6; ++p) CHECK_CLOSE(out.view({6, 4}).select(0, p), weight.select(0, iv[p]), 0, 0);
  CHECK_CLOSE(embedding(noncontiguous(weight), indices), out, 0, 0);
  CHECK_CLOSE(embedding(weight, noncontiguous(indices)), out, 0, 0);
  CHECK(embedding(weight, scalar_tensor(3, DType::Int64)).shape() == Shape{4});
  CHECK(embedding(weight, zeros({2, 0}, DType::Int64)).shape() == Shape{2, 0, 4});
}

TEST_CASE("embedding backward: repeated indices accumulate, padding_idx gets no gradient") {
  Tensor indices = tensor(std::vector<int64_t>{1, 3, 1, 0, 1, 3}, {3, 2});
  Tensor weight = leaf({5, 2}, 171);
  sum(embedding(weight, indices)).backward();
  CHECK(weight.grad().to_vector<double>() == std::vector<double>{1, 1, 3, 3, 0, 0, 2, 2, 0, 0});

  Tensor padded = leaf({5, 2}, 172);
  Tensor out = embedding(padded, indices, -2);  // row 3
  CHECK_CLOSE(out.select(0, 0).select(0, 1), padded.select(0, 3), 0, 0);  // forward reads the row as is
  sum(out).backward();
  CHECK(padded.grad().to_vector<double>() == std::vector<double>{1, 1, 3, 3, 0, 0, 0, 0, 0, 0});

  Tensor w = random({3, 2, 2}, DType::Float64, 173);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mul(embedding(in[0], indices), w); },
                  (std::vector<Tensor>{leaf({4, 2}, 174)}));
  // padding_idx's row is cut off from the gradient on purpose (finite differences would
  // see it), so here it names a row that no index reads: the other rows are unaffected.
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return embedding(in[0], indices, 2); },
                  (std::vector<Tensor>{noncontiguous(random({4, 3}, DType::Float64, 175)).requires_grad_()}));
}

TEST_CASE("scatter-add backward is deterministic and adds in index order") {
  // Large enough for the CPU kernels to split the work across (at least two) threads.
  const int threads = num_threads();
  set_num_threads(std::max(2, threads));
  Generator gen(181);
  const int64_t rows = 50, width = 64, count = 4000;
  Tensor indices = randint(0, rows, {count}, DType::Int64, &gen);
  Tensor weight = random({rows, width}, DType::Float32, 182).requires_grad_();
  Tensor g = random({count, width}, DType::Float32, 183);
  embedding(weight, indices).backward(g);
  // A serial float32 loop in index order must match bit for bit.
  std::vector<float> expected(rows * width, 0.0f);
  auto iv = indices.to_vector<int64_t>();
  auto gv = g.to_vector<float>();
  for (int64_t j = 0; j < count; ++j)
    for (int64_t c = 0; c < width; ++c) expected[iv[j] * width + c] += gv[j * width + c];
  CHECK(weight.grad().to_vector<float>() == expected);

  Tensor x = random({rows, width}, DType::Float32, 184).requires_grad_();
  Tensor index = randint(0, rows, {count, width}, DType::Int64, &gen);
  gather(x, 0, index).backward(g);
  std::vector<float> by_loop(rows * width, 0.0f);
  auto iv2 = index.to_vector<int64_t>();
  for (int64_t j = 0; j < count; ++j)
    for (int64_t c = 0; c < width; ++c) by_loop[iv2[j * width + c] * width + c] += gv[j * width + c];
  CHECK(x.grad().to_vector<float>() == by_loop);

  set_num_threads(threads);
}

// --- errors --------------------------------------------------------------------------------

TEST_CASE("index errors name the bad value, its position and the valid range") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH_AS(index_select(x, 1, tensor(std::vector<int64_t>{0, 4, 1})),
                       doctest::Contains("index_select: index 4 at position [1] is out of range for dimension 1 of "
                                         "size 4 (expected 0 <= index < 4)"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, tensor(std::vector<int64_t>{-1})),
                       doctest::Contains("index -1 at position [0] is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(gather(x, 0, tensor(std::vector<int64_t>{0, 1, 2, 3}, {2, 2})),
                       doctest::Contains("gather: index 3 at position [1, 1] is out of range for dimension 0 of "
                                         "size 3"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(scatter_add(x, 1, tensor(std::vector<int64_t>{9}, {1, 1}), zeros({1, 1})),
                       doctest::Contains("scatter_add: index 9 at position [0, 0] is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(embedding(x, tensor(std::vector<int64_t>{0, 1, 2, 7}, {2, 2})),
                       doctest::Contains("embedding: index 7 at position [1, 1] is out of range for a weight of 3 "
                                         "rows"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(one_hot(tensor(std::vector<int64_t>{0, 3}), 3),
                       doctest::Contains("one_hot: index 3 at position [1] is out of range for 3 classes"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(one_hot(tensor(std::vector<int64_t>{0, -2})),
                       doctest::Contains("one_hot: index -2 at position [1] is negative"), weft::Error);
  CHECK_THROWS_WITH_AS(one_hot(zeros({0}, DType::Int64)), doctest::Contains("cannot infer the number of classes"),
                       weft::Error);

  // Nothing was written before the check failed.
  Tensor base = ones({2, 2});
  CHECK_THROWS_AS(scatter_add(base, 0, tensor(std::vector<int64_t>{0, 5}, {1, 2}), ones({1, 2})), weft::Error);
  CHECK(base.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
}

TEST_CASE("index op errors for dtypes, shapes and devices") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH_AS(index_select(x, 0, tensor({0.0f})),
                       doctest::Contains("index_select: 'index' must be an int64 tensor, got float32"), weft::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, zeros({1, 1}, DType::Int64)),
                       doctest::Contains("index must be 0-d or 1-d, got shape [1, 1]"), weft::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 2, zeros({1}, DType::Int64)),
                       doctest::Contains("index_select: dim 2 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, zeros({1}, DType::Int64).to(Device("cpu:1"))),
                       doctest::Contains("'index' is on cpu:1 and the input on cpu"), weft::Error);
  CHECK_THROWS_WITH_AS(gather(x, 1, zeros({3}, DType::Int64)),
                       doctest::Contains("gather: index must have the input's number of dimensions"), weft::Error);
  CHECK_THROWS_WITH_AS(gather(x, 1, zeros({4, 1}, DType::Int64)),
                       doctest::Contains("index shape [4, 1] does not fit input shape [3, 4]: index.size(0) = 4 > "
                                         "input.size(0) = 3"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(scatter_add(x, 1, zeros({2, 2}, DType::Int64), zeros({2, 1})),
                       doctest::Contains("does not fit src shape [2, 1]"), weft::Error);
  CHECK_THROWS_WITH_AS(scatter_add(x, 1, zeros({2, 2}, DType::Int64), zeros({2, 2}, DType::Float64)),
                       doctest::Contains("scatter_add: dtype mismatch, float32 and float64"), weft::Error);
  CHECK_THROWS_WITH_AS(scatter_add(x, 1, zeros({2, 2}, DType::Int64), zeros({2, 2}).to(Device("cpu:1"))),
                       doctest::Contains("scatter_add: expected all tensors on one device"), weft::Error);
  CHECK_THROWS_WITH_AS(embedding(zeros({3}), zeros({1}, DType::Int64)),
                       doctest::Contains("embedding: expected 'weight' to have 2 dimensions, got shape [3]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(embedding(x, zeros({1}, DType::Int64), 3),
                       doctest::Contains("padding_idx 3 is out of range for a weight of 3 rows"), weft::Error);
  CHECK_THROWS_WITH_AS(one_hot(tensor({1.0f}), 2), doctest::Contains("one_hot: 'index' must be an int64 tensor"),
                       weft::Error);
}
