// cat / stack / split / chunk: forward against hand-computed values and naive loops,
// views, gradients (gradcheck, unused split outputs) and error texts.
#include <numeric>

#include "test_util.h"

using namespace weft;
using test::leaf;
using test::noncontiguous;
using test::random;

namespace {

// Element [i0, i1, i2] of a 3-d tensor, by the tensor's own strides (independent of cat).
double at3(const Tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  Tensor c = t.detach().contiguous().to(DType::Float64);
  return c.data_ptr<double>()[(i0 * t.shape()[1] + i1) * t.shape()[2] + i2];
}

std::vector<int64_t> sizes_along(const std::vector<Tensor>& pieces, int64_t dim) {
  std::vector<int64_t> out;
  for (const Tensor& p : pieces) out.push_back(p.shape()[dim]);
  return out;
}

}  // namespace

TEST_CASE("cat: hand-computed values along dim 0 and -1") {
  Tensor a = tensor({1, 2, 3, 4}, {2, 2});
  Tensor b = tensor({5, 6}, {1, 2});
  CHECK(cat({a, b}).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(cat({a, b}).shape() == Shape{3, 2});
  Tensor c = tensor({7, 8}, {2, 1});
  Tensor out = cat({a, c}, -1);
  CHECK(out.shape() == Shape{2, 3});
  CHECK(out.to_vector<float>() == std::vector<float>{1, 2, 7, 3, 4, 8});
}

TEST_CASE("cat: naive reference over every dim, non-contiguous inputs, empty pieces") {
  for (int64_t dim = -3; dim < 3; ++dim) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Tensor> inputs;
    const int64_t lengths[] = {2, 0, 3, 1};
    for (int i = 0; i < 4; ++i) {
      Shape s{3, 4, 5};
      s[d] = lengths[i];
      Tensor t = random(s, DType::Float32, 10 + i);
      inputs.push_back(i == 2 ? noncontiguous(t) : t);
    }
    CHECK_FALSE(inputs[2].is_contiguous());
    Tensor out = cat(inputs, dim);
    Shape expected{3, 4, 5};
    expected[d] = 6;
    REQUIRE(out.shape() == expected);
    int64_t start = 0;
    for (const Tensor& t : inputs) {
      for (int64_t i0 = 0; i0 < t.shape()[0]; ++i0)
        for (int64_t i1 = 0; i1 < t.shape()[1]; ++i1)
          for (int64_t i2 = 0; i2 < t.shape()[2]; ++i2) {
            int64_t o[3] = {i0, i1, i2};
            o[d] += start;
            CHECK(at3(out, o[0], o[1], o[2]) == at3(t, i0, i1, i2));
          }
      start += t.shape()[d];
    }
  }
}

TEST_CASE("cat and stack: int64 values") {
  Tensor a = arange(6).view({2, 3});
  Tensor b = arange(6, 9).view({1, 3});
  CHECK(cat({a, b}).dtype() == DType::Int64);
  CHECK(cat({a, b}).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  Tensor s = stack({a, a.t().contiguous().t()}, 1);  // second input is non-contiguous
  CHECK(s.shape() == Shape{2, 2, 3});
  CHECK(s.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
}

TEST_CASE("stack: new dim at the front, middle and end") {
  std::vector<Tensor> inputs = {random({3, 4}, DType::Float64, 21), noncontiguous(random({3, 4}, DType::Float64, 22)),
                                random({3, 4}, DType::Float64, 23)};
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    Tensor out = stack(inputs, dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Shape expected{3, 4};
    expected.insert(d, 3);
    REQUIRE(out.shape() == expected);
    for (int64_t i = 0; i < 3; ++i) CHECK_CLOSE(out.select(d, i), inputs[i], 0, 0);
  }
  Tensor scalars = stack({scalar_tensor(1.5), scalar_tensor(-2.0)});
  CHECK(scalars.shape() == Shape{2});
  CHECK(scalars.to_vector<float>() == std::vector<float>{1.5, -2});
}

TEST_CASE("split and chunk: piece sizes, negative dims, views of the input") {
  Tensor x = random({7, 5}, DType::Float64, 31);
  auto pieces = split(x, 3);
  CHECK(sizes_along(pieces, 0) == std::vector<int64_t>{3, 3, 1});
  for (const Tensor& p : pieces) CHECK(p.is_view());
  CHECK_CLOSE(pieces[1], x.narrow(0, 3, 3), 0, 0);
  CHECK_CLOSE(pieces[2], x.narrow(0, 6, 1), 0, 0);

  CHECK(split(x, {3}).size() == 3);  // a braced single value is a split_size (see shape_ops.h)
  auto cols = split(x, std::vector<int64_t>{1, 0, 4}, -1);
  CHECK(sizes_along(cols, 1) == std::vector<int64_t>{1, 0, 4});
  CHECK_CLOSE(cols[2], x.narrow(1, 1, 4), 0, 0);

  // The pieces alias x's storage: a write through x shows in them.
  Tensor base = zeros({4, 2});
  auto halves = chunk(base, 2);
  fill_(base, 3.0);
  CHECK(halves[1].to_vector<float>() == std::vector<float>{3, 3, 3, 3});

  CHECK(sizes_along(chunk(x, 3), 0) == std::vector<int64_t>{3, 3, 1});
  CHECK(sizes_along(chunk(random({6}, DType::Float64, 32), 4), 0) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes_along(chunk(x, 2, -1), 1) == std::vector<int64_t>{3, 2});
  CHECK(sizes_along(chunk(x, 10), 0) == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1});
  CHECK(sizes_along(chunk(zeros({0, 3}), 3), 0) == std::vector<int64_t>{0, 0, 0});
  CHECK(sizes_along(split(zeros({0, 3}), 0), 0) == std::vector<int64_t>{0});

  // Non-contiguous and int64 inputs.
  Tensor nc = noncontiguous(x);
  auto nc_pieces = split(nc, std::vector<int64_t>{2, 5});
  CHECK_CLOSE(nc_pieces[1], x.narrow(0, 2, 5), 0, 0);
  auto ints = chunk(arange(10), 3);
  CHECK(ints[2].to_vector<int64_t>() == std::vector<int64_t>{8, 9});
}

TEST_CASE("cat gradcheck: several inputs, some not requiring grad, non-contiguous") {
  Tensor a = leaf({2, 3}, 41);
  Tensor b = random({2, 1}, DType::Float64, 42);  // held fixed
  Tensor c = noncontiguous(random({2, 4}, DType::Float64, 43)).requires_grad_();
  Tensor w = random({2, 8}, DType::Float64, 44);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mul(cat({in[0], in[1], in[2]}, -1), w); },
                  (std::vector<Tensor>{a, b, c}));
  Tensor d = leaf({1, 3}, 45);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[0]}, 0); },
                  (std::vector<Tensor>{a, d}));
}

TEST_CASE("cat backward: inputs without grad get none, others get their slice") {
  Tensor a = leaf({2, 2}, 46);
  Tensor b = random({1, 2}, DType::Float64, 47);
  Tensor out = cat({a, b});
  Tensor g = random({3, 2}, DType::Float64, 48);
  out.backward(g);
  CHECK_CLOSE(a.grad(), g.narrow(0, 0, 2), 0, 0);
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("stack gradcheck") {
  Tensor a = leaf({3, 2}, 51), b = noncontiguous(random({3, 2}, DType::Float64, 52)).requires_grad_();
  Tensor w = random({3, 2, 2}, DType::Float64, 53);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mul(stack({in[0], in[1]}, -1), w); },
                  (std::vector<Tensor>{a, b}));
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return stack({in[1], in[0], in[1]}, 1); },
                  (std::vector<Tensor>{a, b}));
}

TEST_CASE("split and chunk gradcheck: all outputs, some outputs, one output") {
  Tensor x = leaf({5, 3}, 61);
  Tensor w = random({2, 3}, DType::Float64, 62);
  // Several outputs, combined in different ways.
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        auto p = split(in[0], std::vector<int64_t>{2, 1, 2});
        return cat({mul(p[2], w), p[1], mul(p[0], 3.0)});
      },
      (std::vector<Tensor>{x}));
  // Only some outputs: the engine hands zeros for the unused ones.
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return mul(split(in[0], 2)[1], w); },
                  (std::vector<Tensor>{x}));
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        auto p = chunk(in[0], 2, -1);
        return add(p[0].narrow(1, 0, 1), p[1]);
      },
      (std::vector<Tensor>{noncontiguous(random({4, 4}, DType::Float64, 63)).requires_grad_()}));
}

TEST_CASE("split backward: an unused piece contributes zeros") {
  Tensor x = leaf({6}, 64);
  auto p = chunk(x, 3);
  sum(mul(p[1], 2.0)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 2, 2, 0, 0});
}

TEST_CASE("shape op errors name the op, the position and the shapes") {
  Tensor a = zeros({2, 3});
  CHECK_THROWS_WITH_AS(cat({}), doctest::Contains("cat: expected a non-empty list of tensors"), weft::Error);
  CHECK_THROWS_WITH_AS(stack({}), doctest::Contains("stack: expected a non-empty list"), weft::Error);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3}), zeros({3, 4})}, 0),
                       doctest::Contains("except in dimension 0, but tensor 2 has shape [3, 4] and tensor 0 has "
                                         "shape [2, 3]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3, 1})}), doctest::Contains("tensor 1 has shape [2, 3, 1] but tensor 0"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3}, DType::Float64)}),
                       doctest::Contains("cat: dtype mismatch, tensor 1 is float64 but tensor 0 is float32"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(cat({a, a.to(Device("cpu:1"))}),
                       doctest::Contains("tensor 1 is on cpu:1 and tensor 0 on cpu"), weft::Error);
  CHECK_THROWS_WITH_AS(cat({a, Tensor()}), doctest::Contains("tensor 1 of the list is an undefined tensor"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(cat({scalar_tensor(1)}), doctest::Contains("zero-dimensional"), weft::Error);
  CHECK_THROWS_WITH_AS(cat({a}, 2), doctest::Contains("cat: dim 2 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(stack({a, zeros({3, 2})}),
                       doctest::Contains("stack: expected all tensors to have the same shape, but tensor 1 has "
                                         "shape [3, 2] and tensor 0 has shape [2, 3]"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(stack({a, a}, 3), doctest::Contains("stack: dim 3 is out of range"), weft::Error);
  CHECK_THROWS_WITH_AS(split(a, std::vector<int64_t>{1, 1}, 1),
                       doctest::Contains("split: split sizes [1, 1] sum to 2 but dimension 1 has size 3"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(split(a, std::vector<int64_t>{4, -1}, 1),
                       doctest::Contains("split sizes must be non-negative, but size 1 is -1"), weft::Error);
  CHECK_THROWS_WITH_AS(split(a, 0), doctest::Contains("split_size can only be 0 if dimension 0 has size 0"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(chunk(a, 0), doctest::Contains("chunk: number of chunks must be positive, got 0"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(split(scalar_tensor(1), 1), doctest::Contains("split: cannot split a zero-dimensional"),
                       weft::Error);
}
