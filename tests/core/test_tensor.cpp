// Core: devices, dtypes, shapes, factories, views and aliasing, copies, allocator
// statistics, printing.
#include "test_util.h"

#include <cstdlib>

using namespace weft;
using doctest::Contains;

TEST_CASE("device parsing and printing") {
  CHECK(Device("cpu") == kCPU);
  CHECK(Device("cpu:3") == Device::cpu(3));
  CHECK(Device("cuda") == Device::cuda(0));
  CHECK(Device("cuda:1").str() == "cuda:1");
  CHECK_THROWS_WITH_AS(Device("gpu:0"), Contains("expected cpu, cpu:N, cuda or cuda:N"), Error);
  CHECK_THROWS_WITH_AS(Device("cuda:x"), Contains("must be a non-negative integer"), Error);
  CHECK_THROWS_WITH_AS(Device("cpu:-1"), Contains("non-negative integer"), Error);
  CHECK_THROWS_WITH_AS(Device("cpu:"), Contains("non-negative integer"), Error);
  CHECK_THROWS_WITH_AS(Device("cpu:64"), Contains("cpu:0 .. cpu:63"), Error);
}

TEST_CASE("dtypes: sizes, names, half-precision types") {
  CHECK(element_size(DType::Float32) == 4);
  CHECK(element_size(DType::Int64) == 8);
  CHECK(element_size(DType::Bool) == 1);
  CHECK(dtype_name(DType::UInt8) == "uint8");
  CHECK(element_size(DType::BFloat16) == 2);
  CHECK(dtype_name(DType::Float16) == "float16");
  CHECK_THROWS_WITH_AS(mul(zeros({2}, DType::BFloat16), 2.0), Contains("bfloat16 cannot be computed with"), Error);
}

TEST_CASE("shapes: rank limit, broadcasting errors") {
  CHECK_THROWS_WITH_AS(zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), Contains("at most 8 dimensions"), Error);
  CHECK(broadcast_shapes({3, 1, 5}, {4, 1}, "t") == Shape{3, 4, 5});
  CHECK_THROWS_WITH_AS(broadcast_shapes({3, 2}, {4, 3}, "add"), Contains("add: shapes [3, 2] and [4, 3] cannot be broadcast"),
                       Error);
  CHECK_THROWS_WITH_AS(empty({2, -1}), Contains("negative size"), Error);
}

TEST_CASE("shapes whose element count overflows an int64 are errors, not 0-byte tensors") {
  // Issue 11, item 1: zeros({2^32, 2^32}) made a 0-byte tensor that select() then read.
  const int64_t big = int64_t{1} << 32;
  CHECK_THROWS_WITH_AS(zeros({big, big}), doctest::Contains("has more elements than an int64 counts"), Error);
  CHECK_THROWS_WITH_AS(zeros({0, big, big}), doctest::Contains("empty: shape [0, 4294967296, 4294967296]"), Error);
  CHECK_THROWS_WITH_AS(empty({int64_t{1} << 61}, DType::Float64), doctest::Contains("more bytes than an int64 counts"),
                       Error);
  CHECK_THROWS_WITH_AS(zeros({0}).reshape({0, big, big}), doctest::Contains("reshape: shape [0, 4294967296"), Error);
  CHECK_THROWS_WITH_AS(ones({1, 1}).expand({big, big}), doctest::Contains("expand: shape"), Error);
  CHECK(zeros({0, 1 << 20, 1 << 20}).numel() == 0);  // large but countable: fine
}

TEST_CASE("factories") {
  CHECK(zeros({2, 3}).to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK(ones({2}, DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  CHECK(full({3}, 2.5, DType::Float64).to_vector<double>() == std::vector<double>{2.5, 2.5, 2.5});
  CHECK(arange(5).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25, DType::Float32).to_vector<float>() == std::vector<float>{1, 1.25, 1.5, 1.75});
  CHECK(arange(3, 0, -1).to_vector<int64_t>() == std::vector<int64_t>{3, 2, 1});
  CHECK(arange(0, 0).numel() == 0);
  Tensor s = scalar_tensor(4, DType::Int32);
  CHECK(s.dim() == 0);
  CHECK(s.item<int>() == 4);
  Tensor t = tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dtype() == DType::Float64);
  CHECK_THROWS_WITH_AS(tensor(std::vector<float>{1, 2, 3}, {2, 2}), Contains("3 values do not fill shape [2, 2]"),
                       Error);
  CHECK(tensor(std::vector<bool>{true, false}).to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  Tensor r = zeros({2}, TensorOptions(DType::Float32, kCPU, true));
  CHECK(r.requires_grad());
  CHECK(r.is_leaf());
}

TEST_CASE("views alias storage and have the right strides") {
  Tensor base = arange(0, 24, 1, DType::Float32).view({2, 3, 4});
  CHECK(base.strides() == Shape{12, 4, 1});

  Tensor p = base.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK_FALSE(p.is_contiguous());

  Tensor n = base.narrow(2, 1, 2);
  CHECK(n.shape() == Shape{2, 3, 2});
  CHECK(n.offset() == 1);
  Tensor s = base.slice(1, 0, 3, 2);
  CHECK(s.shape() == Shape{2, 2, 4});
  CHECK(s.to_vector<float>()[4] == 8.f);  // [0, 1, 0] is row 2 of the first matrix
  Tensor sel = base.select(0, -1);
  CHECK(sel.shape() == Shape{3, 4});
  CHECK(sel.to_vector<float>()[0] == 12.f);

  // Writing through a view changes the base.
  Tensor row = base.select(1, 1);
  fill_(row, -1.0);
  CHECK(base.to_vector<float>()[4] == -1.f);
  CHECK(base.to_vector<float>()[16] == -1.f);
  CHECK(base.to_vector<float>()[3] == 3.f);

  Tensor e = tensor({1, 2, 3}).view({3, 1}).expand({3, 4});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(e.to_vector<float>() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK(tensor({1, 2}).expand({2, 2}).to_vector<float>() == std::vector<float>{1, 2, 1, 2});
  CHECK_THROWS_WITH_AS(tensor({1, 2}).expand({3, 3}), Contains("cannot expand shape [2] to [3, 3]"), Error);

  Tensor u = tensor({1, 2, 3}).unsqueeze(0).unsqueeze(-1);
  CHECK(u.shape() == Shape{1, 3, 1});
  CHECK(u.squeeze().shape() == Shape{3});
  CHECK(u.squeeze(0).shape() == Shape{3, 1});
  CHECK(u.squeeze(1).shape() == Shape{1, 3, 1});
  CHECK(base.flatten(1).shape() == Shape{2, 12});
  CHECK(base.flatten().shape() == Shape{24});
  CHECK_THROWS_WITH_AS(base.t(), Contains("t: expected a tensor with at most 2 dimensions"), Error);
  CHECK(zeros({2, 5}).t().shape() == Shape{5, 2});
}

TEST_CASE("view versus reshape") {
  Tensor m = test::random({4, 6}, DType::Float32, 3);
  Tensor mt = m.t();
  CHECK_THROWS_WITH_AS(mt.view({24}), Contains("use reshape"), Error);
  Tensor r = mt.reshape({24});
  CHECK(r.is_contiguous());
  CHECK(r.storage() != m.storage());  // had to copy
  CHECK(r.to_vector<float>() == mt.contiguous().to_vector<float>());
  // Splitting a dim of a transposed tensor is still a view.
  Tensor split = mt.view({2, 3, 4});
  CHECK(split.storage() == m.storage());
  CHECK(split.to_vector<float>() == mt.contiguous().view({2, 3, 4}).to_vector<float>());
  CHECK(m.view({-1, 3}).shape() == Shape{8, 3});
  CHECK_THROWS_WITH_AS(m.view({5, -1}), Contains("invalid for input of size 24"), Error);
  CHECK_THROWS_WITH_AS(m.view({-1, -1}), Contains("only one dimension can be -1"), Error);
}

TEST_CASE("view errors name the op and the bounds") {
  Tensor t = zeros({2, 3});
  CHECK_THROWS_WITH_AS(t.narrow(1, 2, 2), Contains("narrow: range [2, 4) is out of bounds for dim 1 of size 3"), Error);
  CHECK_THROWS_WITH_AS(t.select(0, 2), Contains("select: index 2 is out of bounds for dim 0 of size 2"), Error);
  CHECK_THROWS_WITH_AS(t.permute({0, 0}), Contains("appears twice"), Error);
  CHECK_THROWS_WITH_AS(t.transpose(0, 2), Contains("dim 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(t.as_strided({3, 3}, {3, 1}, 0), Contains("storage holds 6"), Error);
  CHECK(t.as_strided({2, 2}, {1, 2}, 1).shape() == Shape{2, 2});
}

TEST_CASE("copies and conversions") {
  Tensor a = test::random({3, 4}, DType::Float64, 5);
  Tensor c = a.clone();
  CHECK(c.storage() != a.storage());
  CHECK(c.to_vector<double>() == a.to_vector<double>());

  Tensor f = a.to(DType::Float32);
  CHECK(f.dtype() == DType::Float32);
  CHECK_CLOSE(f, a, 1e-6, 1e-6);
  CHECK(a.to(DType::Float64).is_same(a));
  Tensor i = tensor(std::vector<double>{1.7, -2.2, 3.0}).to(DType::Int64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3});

  // NaN and out-of-range values convert as the GPU converts them: saturated, NaN to 0
  // (undefined behaviour in C++, INT_MIN on x86 before).
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  Tensor edge = tensor(std::vector<double>{nan, inf, -inf, 1e20, -1e20, 9.3e18, 2.9, -2.9, 255.5, 300});
  CHECK(edge.to(DType::Int64).to_vector<int64_t>() ==
        std::vector<int64_t>{0, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, INT64_MAX, 2, -2, 255, 300});
  CHECK(edge.to(DType::Int32).to_vector<int32_t>() ==
        std::vector<int32_t>{0, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX, 2, -2, 255, 300});
  CHECK(edge.to(DType::UInt8).to_vector<uint8_t>() == std::vector<uint8_t>{0, 255, 0, 255, 0, 255, 2, 0, 255, 255});
  CHECK(edge.to(DType::Float32).to(DType::Int32).to_vector<int32_t>()[5] == INT32_MAX);
  CHECK(edge.to(DType::Bool).to(DType::UInt8).to_vector<uint8_t>()[0] == 1);  // NaN != 0
  CHECK(full({2}, nan, DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{0, 0});

  Tensor dst = zeros({2, 3});
  dst.copy_(tensor(std::vector<int64_t>{1, 2, 3}));  // broadcasts, converts
  CHECK(dst.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  CHECK_THROWS_WITH_AS(dst.copy_(zeros({3, 3})), Contains("does not broadcast to destination shape [2, 3]"), Error);

  Tensor nc = test::noncontiguous(a);
  CHECK_FALSE(nc.is_contiguous());
  CHECK(nc.contiguous().to_vector<double>() == a.to_vector<double>());

  CHECK_THROWS_WITH_AS(a.item(), Contains("item: expected a tensor with one element, got shape [3, 4]"), Error);
  CHECK_THROWS_WITH_AS(a.data_ptr<float>(), Contains("tensor has dtype float64 but float32 was asked for"), Error);
  CHECK_THROWS_WITH_AS(zeros({1}, Device::cuda(0)), Contains("cuda:0"), Error);
}

TEST_CASE("logical CPU devices keep separate accounts") {
  Device d1("cpu:1"), d2("cpu:2");
  AllocatorStats before1 = memory_stats(d1), before2 = memory_stats(d2);
  {
    Tensor t = zeros({1000}, TensorOptions(DType::Float32, d1));
    CHECK(t.device() == d1);
    CHECK(memory_stats(d1).bytes_in_use == before1.bytes_in_use + 4000);
    CHECK(memory_stats(d1).num_allocations == before1.num_allocations + 1);
    CHECK(memory_stats(d2).bytes_in_use == before2.bytes_in_use);
    Tensor moved = t.to(d2);
    CHECK(moved.device() == d2);
    CHECK(memory_stats(d2).bytes_in_use == before2.bytes_in_use + 4000);
    CHECK(reinterpret_cast<uintptr_t>(moved.raw_data()) % 64 == 0);
    CHECK_THROWS_WITH_AS(add(t, moved), Contains("expected all tensors on one device, got cpu:1 and cpu:2"), Error);
  }
  AllocatorStats after = memory_stats(d1);
  CHECK(after.bytes_in_use == before1.bytes_in_use);
  CHECK(after.peak_bytes_in_use >= before1.bytes_in_use + 4000);
  CHECK(after.total_allocations == before1.total_allocations + 1);
  reset_peak_memory_stats(d1);
  CHECK(memory_stats(d1).peak_bytes_in_use == after.bytes_in_use);
}

TEST_CASE("the host block cache hands a freed large block to the next request of its size") {
  // Note [Host block cache] in core/allocator.cpp; tools/sanitize runs with WEFT_CPU_ALLOCATOR=direct.
  const char* mode = std::getenv("WEFT_CPU_ALLOCATOR");
  const bool caching = mode == nullptr || std::string(mode) != "direct";
  const Device d("cpu:5");
  const int64_t mib = int64_t{1} << 20;
  const AllocatorStats before = memory_stats(d);
  const void* first = nullptr;
  {
    Tensor t = zeros({mib / 4}, TensorOptions(DType::Float32, d));
    first = t.raw_data();
  }
  const AllocatorStats freed = memory_stats(d);
  CHECK(freed.bytes_in_use == before.bytes_in_use);
  CHECK(freed.bytes_reserved == before.bytes_reserved + (caching ? mib : 0));
  Tensor again = zeros({mib / 4}, TensorOptions(DType::Float32, d));
  if (caching) CHECK(again.raw_data() == first);
  CHECK(memory_stats(d).bytes_reserved == before.bytes_reserved + mib);  // in use now, cached no more
  {
    Tensor small = zeros({1000}, TensorOptions(DType::Float32, d));  // below the cache's 256 KiB
  }
  CHECK(memory_stats(d).bytes_reserved == before.bytes_reserved + mib);
  CHECK(amax(abs(again)).item<double>() == 0.0);  // zeros() fills a reused block as a new one
}

TEST_CASE("printing") {
  std::string s = tensor({1.5f, -2.f}).str();
  CHECK(s == "tensor([ 1.5000, -2.0000], dtype=float32, device=cpu:0)");
  CHECK(scalar_tensor(3, DType::Int64).str() == "tensor(3, shape=[], dtype=int64, device=cpu:0)");
  Tensor m = arange(6).view({2, 3});
  CHECK(m.str() == "tensor([[0, 1, 2],\n        [3, 4, 5]], shape=[2, 3], dtype=int64, device=cpu:0)");
  Tensor g = mul(ones({2}).requires_grad_(), 2.0);
  CHECK(g.str().find("grad_fn=<AffineBackward>") != std::string::npos);
  CHECK(zeros({2000}).str().find("...") != std::string::npos);
  CHECK(Tensor().str() == "tensor(undefined)");
  // Any NaN prints as nan, as in PyTorch: an empty mean's 0 / 0 is a negative NaN on x86.
  Tensor empty_mean = mean(zeros({0}, DType::Float64));
  CHECK(empty_mean.str() == "tensor(nan, shape=[], dtype=float64, device=cpu:0)");
  CHECK(tensor({-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}).str() ==
        "tensor([-inf,  nan], dtype=float32, device=cpu:0)");
}
