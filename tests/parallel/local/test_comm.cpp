// parallel/local/comm and its differentiable forms on logical CPU devices: broadcast (plain and
// coalesced), reduce_add (plain and coalesced), scatter and gather against hand-computed
// results, uneven and explicit chunks, non-contiguous and int64 inputs, the errors, and
// gradcheck through broadcast, scatter and gather.
#include "test_util.h"

#include "parallel/local/comm.h"
#include "parallel/local/functions.h"

using namespace weft;
using doctest::Contains;

namespace {

const Device c0("cpu:0"), c1("cpu:1"), c2("cpu:2"), c3("cpu:3");

Tensor on(const Tensor& t, Device d) { return t.to(d); }

}  // namespace

TEST_CASE("comm::broadcast: a copy per device, the tensor itself on its own device") {
  Tensor x = test::random({3, 4}, DType::Float32, 1);
  auto out = parallel::comm::broadcast(x, {c0, c2, c1});
  REQUIRE(out.size() == 3);
  CHECK(out[0].raw_data() == x.raw_data());  // no copy on the source
  CHECK(out[1].device() == c2);
  CHECK(out[2].device() == c1);
  for (const Tensor& t : out) CHECK_CLOSE(t.to(c0), x, 0, 0);
  CHECK_THROWS_WITH_AS(parallel::comm::broadcast(x, {c0, c1, c0}), Contains("device cpu:0 is given twice"), Error);
  CHECK_THROWS_WITH_AS(parallel::comm::broadcast(x, {}), Contains("no devices given"), Error);
  CHECK_THROWS_WITH_AS(parallel::comm::broadcast(x, {c0, Device::cuda(0)}), Contains("devices must be of one type"),
                       Error);
}

TEST_CASE("comm::broadcast_coalesced: dtypes bucketed, views of one flat copy per bucket, order kept") {
  std::vector<Tensor> tensors = {test::random({4, 3}, DType::Float32, 2),
                                 test::noncontiguous(test::random({2, 5}, DType::Float64, 3)),
                                 randint(-9, 9, {7}, DType::Int64), test::random({6}, DType::Float32, 4),
                                 zeros({0, 3}), test::random({}, DType::Float64, 5)};
  for (int64_t buffer : {int64_t{1} << 20, int64_t{40}}) {  // one bucket per dtype; then tiny buckets
    CAPTURE(buffer);
    auto out = parallel::comm::broadcast_coalesced(tensors, {c0, c1, c3}, buffer);
    REQUIRE(out.size() == 3);
    for (size_t d = 0; d < out.size(); ++d) {
      REQUIRE(out[d].size() == tensors.size());
      for (size_t j = 0; j < tensors.size(); ++j) {
        CAPTURE(d);
        CAPTURE(j);
        CHECK(out[d][j].device() == (d == 0 ? c0 : d == 1 ? c1 : c3));
        CHECK(out[d][j].dtype() == tensors[j].dtype());
        CHECK(out[d][j].shape() == tensors[j].shape());
        CHECK_CLOSE(out[d][j].to(c0), tensors[j], 0, 0);
        CHECK_FALSE(out[d][j].requires_grad());
      }
    }
    for (size_t j = 0; j < tensors.size(); ++j) CHECK(out[0][j].storage() == tensors[j].storage());
    // The two float32 tensors (48 + 24 bytes) share one flat buffer when the bucket holds both.
    CHECK((out[1][0].storage() == out[1][3].storage()) == (buffer > 72));
  }
  CHECK_THROWS_WITH_AS(parallel::comm::broadcast_coalesced(tensors, {c1, c0}),
                       Contains("tensor 0 is on cpu:0 but devices[0], the source, is cpu:1"), Error);
}

TEST_CASE("comm::reduce_add: index-order sums on the destination; coalesced equals per tensor") {
  Tensor a = tensor({1.0f, 2.0f, 3.0f}), b = on(tensor({10.0f, 20.0f, 30.0f}), c1),
         c = on(tensor({100.0f, 200.0f, 300.0f}), c2);
  Tensor sum3 = parallel::comm::reduce_add({a, b, c}, c1);
  CHECK(sum3.device() == c1);
  CHECK(sum3.to_vector<float>() == std::vector<float>{111, 222, 333});
  Tensor alone = parallel::comm::reduce_add({a}, c0);
  CHECK(alone.raw_data() != a.raw_data());  // a fresh tensor, never an alias of an input
  CHECK(parallel::comm::reduce_add({Tensor(), on(tensor(std::vector<int64_t>{4, 5}), c3), tensor(std::vector<int64_t>{1, 1})}, c0)
            .to_vector<int64_t>() == std::vector<int64_t>{5, 6});
  CHECK_THROWS_WITH_AS(parallel::comm::reduce_add({a, on(tensor({1.0f, 2.0f}), c1)}, c0),
                       Contains("tensor 1 is float32 [2] but the first is float32 [3]"), Error);
  CHECK_THROWS_WITH_AS(parallel::comm::reduce_add({Tensor()}, c0), Contains("no tensor to sum"), Error);

  std::vector<std::vector<Tensor>> lists;
  for (int d = 0; d < 3; ++d)
    lists.push_back({on(test::random({5, 2}, DType::Float64, 10 + d), Device(DeviceType::CPU, d)),
                     on(test::noncontiguous(test::random({3, 4}, DType::Float32, 20 + d)), Device(DeviceType::CPU, d)),
                     on(randint(0, 100, {9}, DType::Int64), Device(DeviceType::CPU, d))});
  for (int64_t buffer : {int64_t{1} << 20, int64_t{16}}) {
    auto out = parallel::comm::reduce_add_coalesced(lists, c2, buffer);
    REQUIRE(out.size() == 3);
    for (size_t j = 0; j < 3; ++j) {
      CHECK(out[j].device() == c2);
      CHECK_CLOSE(out[j], parallel::comm::reduce_add({lists[0][j], lists[1][j], lists[2][j]}, c2), 0, 0);
    }
  }
  lists[1][2] = on(randint(0, 100, {8}, DType::Int64), c1);
  CHECK_THROWS_WITH_AS(parallel::comm::reduce_add_coalesced(lists, c0),
                       Contains("tensor 2 of list 1 is int64 [8] but in list 0 it is int64 [9]"), Error);
}

TEST_CASE("comm::scatter: chunk's rule (5 over 4 devices is 2, 2, 1), explicit sizes, any dim") {
  CHECK(parallel::comm::scatter_sizes(5, 4) == std::vector<int64_t>{2, 2, 1});
  CHECK(parallel::comm::scatter_sizes(8, 4) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(parallel::comm::scatter_sizes(2, 4) == std::vector<int64_t>{1, 1});
  CHECK(parallel::comm::scatter_sizes(10, 3) == std::vector<int64_t>{4, 4, 2});
  Tensor x = arange(15).reshape({5, 3});
  auto pieces = parallel::comm::scatter(x, {c0, c1, c2, c3});
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].device() == c0);
  CHECK(pieces[2].device() == c2);
  CHECK(pieces[1].to_vector<int64_t>() == std::vector<int64_t>{6, 7, 8, 9, 10, 11});
  CHECK(pieces[2].to_vector<int64_t>() == std::vector<int64_t>{12, 13, 14});

  Tensor y = test::noncontiguous(test::random({4, 6}, DType::Float32, 30));
  auto columns = parallel::comm::scatter(y, {c1, c2}, {4, 2}, 1);
  REQUIRE(columns.size() == 2);
  CHECK(columns[0].shape() == Shape{4, 4});
  CHECK_CLOSE(columns[1].to(c0), y.narrow(1, 4, 2), 0, 0);

  CHECK_THROWS_WITH_AS(parallel::comm::scatter(x, {c0, c1}, {4, 2}), Contains("sum to 6 but the dimension has size 5"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::comm::scatter(x, {c0, c1}, {5, 0}), Contains("chunk 1 has size 0"), Error);
  CHECK_THROWS_WITH_AS(parallel::comm::scatter(x, {c0, c1}, {1, 1, 3}), Contains("3 chunk sizes for 2 devices"), Error);
  CHECK_THROWS_WITH_AS(parallel::comm::scatter(zeros({0, 3}), {c0, c1}), Contains("nothing to scatter"), Error);
  CHECK_THROWS_WITH_AS(parallel::comm::scatter(scalar_tensor(1.0), {c0, c1}), Contains("0-d tensor"), Error);
}

TEST_CASE("comm::gather: joins along dim, checks every other dim, joins 0-d tensors as a vector") {
  Tensor a = arange(6).reshape({2, 3}), b = on(arange(6, 15).reshape({3, 3}), c2);
  Tensor rows = parallel::comm::gather({a, b}, c1);
  CHECK(rows.device() == c1);
  CHECK(rows.shape() == Shape{5, 3});
  CHECK(rows.to_vector<int64_t>() == arange(15).to_vector<int64_t>());
  Tensor cols = parallel::comm::gather({test::noncontiguous(test::random({3, 2}, DType::Float64, 40)),
                                        on(test::random({3, 4}, DType::Float64, 41), c1)},
                                       c0, -1);
  CHECK(cols.shape() == Shape{3, 6});
  CHECK_CLOSE(cols.narrow(1, 2, 4), test::random({3, 4}, DType::Float64, 41), 0, 0);
  Tensor losses = parallel::comm::gather({scalar_tensor(1.5), on(scalar_tensor(2.5), c1)}, c0);
  CHECK(losses.shape() == Shape{2});
  CHECK(losses.to_vector<float>() == std::vector<float>{1.5f, 2.5f});
  CHECK_THROWS_WITH_AS(parallel::comm::gather({a, on(arange(8).reshape({2, 4}), c1)}, c0),
                       Contains("tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3] (every dim but dim 0 must match)"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::comm::gather({a, zeros({2, 3})}, c0), Contains("tensor 1 is float32 but tensor 0 is int64"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::comm::gather({}, c0), Contains("no tensors to gather"), Error);
}

TEST_CASE("broadcast, scatter and gather pass gradients: gradcheck over three devices") {
  const std::vector<Device> devices = {c0, c1, c2};
  Tensor w = test::leaf({3, 2}, 50), v = test::leaf({4}, 51);
  // Each device computes with its copies; the sum depends on every copy.
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        auto copies = parallel::broadcast({in[0], in[1]}, devices);
        std::vector<Tensor> parts;
        for (size_t d = 0; d < devices.size(); ++d)
          parts.push_back(mul(sum(mul(copies[d][0], static_cast<double>(d + 1))), sum(exp(copies[d][1]))).to(c0));
        return add(add(parts[0], parts[1]), parts[2]);
      },
      std::vector<Tensor>({w, v}));
  Tensor x = test::leaf({5, 3}, 52);
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        auto pieces = parallel::scatter(in[0], devices);
        std::vector<Tensor> outs;
        for (size_t i = 0; i < pieces.size(); ++i) outs.push_back(mul(tanh(pieces[i]), static_cast<double>(i + 2)));
        return parallel::gather(outs, c1);
      },
      std::vector<Tensor>({x}));
  // 0-d outputs gathered into a vector, and a gather onto a device none of them is on.
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        auto pieces = parallel::scatter(in[0], {c1, c2}, {2, 3}, 0);
        return parallel::gather({sum(pieces[0]), mul(sum(pieces[1]), 3.0)}, c3);
      },
      std::vector<Tensor>({x}));
}

TEST_CASE("broadcast: the gradient of every copy is summed onto the source; copies of inputs without grad record nothing") {
  Tensor w = ones({2}).requires_grad_();
  Tensor fixed = ones({2});
  auto copies = parallel::broadcast({w, fixed}, {c0, c1, c2});
  CHECK(copies[1][0].requires_grad());
  CHECK_FALSE(copies[1][1].requires_grad());
  Tensor total = add(add(sum(copies[0][0]), mul(sum(copies[1][0]), 2.0).to(c0)), mul(sum(copies[2][0]), 4.0).to(c0));
  total.backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{7, 7});
  CHECK(w.grad().device() == c0);
}
