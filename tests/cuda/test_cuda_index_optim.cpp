// CUDA index ops and fused optimizer kernels against the CPU ones, on the same fresh inputs.
//
// Index ops: index_select, gather and one_hot copy values, and index_add / scatter_add add
// each destination's contributions in index order on both devices (Note [Deterministic
// index_add / scatter_add on CUDA] in kernels/cuda/index_ops.cu): every comparison of
// this half is exact (atol = rtol = 0), backward passes included.
// Optimizers: SGD / Adam / AdamW over 170 parameters (more than one launch holds, with an
// empty, a one-element and a 1000003-element tensor among them), several steps with one
// parameter skipped in one step, parameters and state compared with the CPU after every
// step. The GPU may contract products into FMAs, so float64 is compared to 1e-12
// relative and float32 to 1e-5 relative (1e-6 absolute). clip_grad_norm_: norms
// 1, 2, 3.5 and inf, compared to 1e-11 relative (float64 sums in another order; the inf
// norm exactly), NaN and inf gradients (scaled as the CPU scales them), and bitwise repeatability on the GPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/index_ops_kernels.h"
#include "nn/optim/adam.h"
#include "nn/optim/clip_grad.h"
#include "nn/optim/sgd.h"

using namespace weft;
using namespace weft::test;

namespace {

#define CHECK_GPU_EXACT(gpu_tensor, cpu_tensor) CHECK_GPU_MATCHES(gpu_tensor, cpu_tensor, 0.0, 0.0)

const DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool};
const DType kNumericDTypes[] = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8};
const DType kFloatDTypes[] = {DType::Float32, DType::Float64};

// Uniform integers in [lo, hi) from a host generator: exact, and the same for both devices.
std::vector<int64_t> random_ints(int64_t count, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t& v : values) v = dist(gen);
  return values;
}

Tensor random_index(const Shape& shape, int64_t bound, uint64_t seed) {
  return tensor(random_ints(shape.numel(), 0, bound, seed), shape);
}

// Normal values for floating dtypes; integers over the dtype's small range otherwise
// (uint8 sums wrap, on both devices alike).
Tensor random_values(const Shape& shape, DType dtype, uint64_t seed) {
  if (is_floating(dtype)) return random(shape, dtype, seed);
  const int64_t lo = dtype == DType::Int64 || dtype == DType::Int32 ? -100 : 0;
  const int64_t hi = dtype == DType::Bool ? 2 : dtype == DType::UInt8 ? 256 : 100;
  return tensor(random_ints(shape.numel(), lo, hi, seed), shape).to(dtype);
}

// --- index ops ------------------------------------------------------------------------

TEST_CASE("index_select on CUDA: every dim and dtype, non-contiguous, row widths, 0-d and empty") {
  for (DType dtype : kAllDTypes) {
    CAPTURE(dtype);
    Tensor x = random_values({7, 5, 9}, dtype, 1);
    for (int64_t dim = 0; dim < 3; ++dim) {
      CAPTURE(dim);
      Tensor idx = random_index({11}, x.shape()[dim], 10 + dim);
      Tensor expected = index_select(x, dim, idx);
      CHECK_GPU_EXACT(index_select(on_gpu(x), dim, on_gpu(idx)), expected);
      CHECK_GPU_EXACT(index_select(noncontiguous(on_gpu(x)), dim, on_gpu(idx)), expected);
      CHECK_GPU_EXACT(index_select(on_gpu(x), dim, on_gpu(scalar_tensor(2, DType::Int64))),
                      index_select(x, dim, scalar_tensor(2, DType::Int64)));
    }
  }
  // Row widths 3 (4 threads per row), 1000 (a block per row, looping) and 1 (a long 1-d input).
  for (const Shape& shape : {Shape{50, 3}, Shape{300, 1000}, Shape{1000003}}) {
    CAPTURE(shape);
    Tensor x = random(shape, DType::Float32, 2);
    Tensor idx = random_index({shape[0] == 1000003 ? 1000003 : 777}, shape[0], 3);
    CHECK_GPU_EXACT(index_select(on_gpu(x), 0, on_gpu(idx)), index_select(x, 0, idx));
  }
  // A slice with a step as input.
  Tensor wide = random({20, 9}, DType::Float64, 4);
  Tensor idx = random_index({13}, 10, 5);
  CHECK_GPU_EXACT(index_select(on_gpu(wide).slice(0, 1, 20, 2), 0, on_gpu(idx)),
                  index_select(wide.slice(0, 1, 20, 2), 0, idx));
  CHECK_GPU_EXACT(index_select(on_gpu(scalar_tensor(7.0)), 0, on_gpu(tensor(std::vector<int64_t>{0}))),
                  index_select(scalar_tensor(7.0), 0, tensor(std::vector<int64_t>{0})));
  Tensor none = index_select(on_gpu(wide), 0, on_gpu(zeros({0}, DType::Int64)));
  CHECK(none.shape() == Shape{0, 9});
  CHECK(none.device() == gpu());
}

// A bad index on CUDA is a device-side error (Note [Device-side errors]): the op returns,
// its output reads 0 where the index was bad, and the next synchronisation (here the copy
// to the host) raises the error, naming the op and the first bad entry (the smallest flat
// position, whatever the timing).
TEST_CASE("index checks on CUDA report the first bad entry of a long index, and one_hot infers the max") {
  Tensor x = on_gpu(random({5, 3}, DType::Float32, 6));
  std::vector<int64_t> iv = random_ints(1000003, 0, 5, 7);
  CHECK_GPU_EXACT(index_select(x, 0, on_gpu(tensor(iv))), index_select(x.to(kCPU), 0, tensor(iv)));
  iv[900001] = -1;
  iv[700001] = 5;
  Tensor selected = index_select(x, 0, on_gpu(tensor(iv)));  // no host synchronisation, so no error yet
  CHECK_THROWS_WITH_AS(selected.to(kCPU),
                       doctest::Contains("index_select: index 5 at flat position 700001 is out of range (expected 0 "
                                         "<= index < 5); found on cuda:0"),
                       weft::Error);
  CHECK(selected.to(kCPU).select(0, 700001).to_vector<float>() == std::vector<float>{0, 0, 0});  // read as 0
  iv[12] = -7;
  CHECK_THROWS_WITH_AS(index_select(x, 0, on_gpu(tensor(iv))).to(kCPU),
                       doctest::Contains("index -7 at flat position 12"), weft::Error);

  std::vector<int64_t> gv(12, 1);
  gv[11] = 3;
  CHECK_THROWS_WITH_AS(
      sum(gather(x, 1, on_gpu(tensor(gv, {4, 3})))).item(),
      doctest::Contains("gather: index 3 at flat position 11 is out of range (expected 0 <= index < 3)"), weft::Error);
  gv[11] = 5;
  CHECK_THROWS_WITH_AS(embedding(x, on_gpu(tensor(gv, {2, 6}))).to(kCPU),
                       doctest::Contains("embedding: index 5 at flat position 11"), weft::Error);
  // The GPU is still usable, and the record was cleared when it was raised.
  CHECK_GPU_EXACT(index_select(x, 0, on_gpu(tensor(std::vector<int64_t>{4, 0}))),
                  index_select(x.to(kCPU), 0, tensor(std::vector<int64_t>{4, 0})));

  std::vector<int64_t> classes = random_ints(100003, 0, 10, 8);
  classes[55555] = 41;
  Tensor hot = one_hot(on_gpu(tensor(classes)));
  CHECK(hot.shape() == Shape{100003, 42});
  CHECK_GPU_EXACT(hot, one_hot(tensor(classes)));
  classes[77] = -2;
  CHECK_THROWS_WITH_AS(one_hot(on_gpu(tensor(classes))), doctest::Contains("index -2 at position [77] is negative"),
                       weft::Error);
  Tensor small = random_index({4, 5}, 6, 9);
  CHECK_GPU_EXACT(one_hot(on_gpu(small), 6), one_hot(small, 6));
  CHECK(one_hot(on_gpu(zeros({0}, DType::Int64)), 3).shape() == Shape{0, 3});
}

TEST_CASE("index_select backward on CUDA (index_add) matches the CPU bit for bit") {
  struct Case {
    Shape shape;
    int64_t dim;
    int64_t k;
    int64_t distinct;  // indices drawn from [0, distinct): fewer rows, more repeats
  };
  const Case cases[] = {
      {{50, 33, 9}, 1, 200, 33},  // outer rows, one column block of 9
      {{300, 70}, 0, 5000, 300},  // five index tiles, 70 columns (four per lane)
      {{40, 1000}, 0, 3000, 3},   // eight column blocks, three hot rows
      {{64, 37}, 1, 100, 37},     // one column, many outer rows
      {{1000003}, 0, 2000, 1000003},
      {{7, 1}, 0, 9, 7},
  };
  for (DType dtype : kFloatDTypes) {
    for (const Case& c : cases) {
      CAPTURE(dtype);
      CAPTURE(c.shape);
      Tensor x = random(c.shape, dtype, 11);
      Tensor idx = random_index({c.k}, c.distinct, 12);
      Tensor x_cpu = x.detach().requires_grad_();
      Tensor out = index_select(x_cpu, c.dim, idx);
      Tensor grad_out = random(out.shape(), dtype, 13);
      out.backward(grad_out);
      Tensor x_gpu = on_gpu(x, true);
      index_select(x_gpu, c.dim, on_gpu(idx)).backward(on_gpu(grad_out));
      CHECK_GPU_EXACT(x_gpu.grad(), x_cpu.grad());
    }
  }
}

TEST_CASE("index_add on CUDA for integer dtypes, with a skipped row") {
  for (DType dtype : kNumericDTypes) {
    CAPTURE(dtype);
    Tensor src = random_values({3, 40, 5}, dtype, 14);
    Tensor idx = random_index({40}, 11, 15);
    Tensor out_cpu = random_values({3, 11, 5}, dtype, 16);
    Tensor out_gpu = on_gpu(out_cpu);
    index_add_stub(kCPU, src, idx, out_cpu, 3, 11, 5, 4);
    index_add_stub(gpu(), on_gpu(src), on_gpu(idx), out_gpu, 3, 11, 5, 4);
    CHECK_GPU_EXACT(out_gpu, out_cpu);
  }
}

TEST_CASE("embedding on CUDA: forward rows, backward with repeats and padding_idx, repeatable") {
  struct Case {
    int64_t rows, width;
    Shape indices;
    int64_t distinct;
  };
  const Case cases[] = {{5003, 67, {37, 111}, 100}, {5003, 67, {37, 111}, 5003}, {1000, 512, {20000}, 1000}};
  for (DType dtype : kFloatDTypes) {
    for (const Case& c : cases) {
      Tensor weight = random({c.rows, c.width}, dtype, 21);
      Tensor idx = random_index(c.indices, c.distinct, 22);
      Shape out_shape = c.indices;
      out_shape.push_back(c.width);
      Tensor grad_out = random(out_shape, dtype, 23);
      for (std::optional<int64_t> padding : {std::optional<int64_t>{}, std::optional<int64_t>{3},
                                             std::optional<int64_t>{-c.rows + 5}}) {
        CAPTURE(dtype);
        CAPTURE(c.width);
        CAPTURE(c.distinct);
        const int64_t padding_shown = padding.value_or(-1);
        CAPTURE(padding_shown);
        Tensor w_cpu = weight.detach().requires_grad_();
        Tensor out = embedding(w_cpu, idx, padding);
        out.backward(grad_out);

        Tensor w_gpu = on_gpu(weight, true);
        Tensor out_gpu = embedding(w_gpu, on_gpu(idx), padding);
        CHECK_GPU_EXACT(out_gpu, out);
        out_gpu.backward(on_gpu(grad_out));
        CHECK_GPU_EXACT(w_gpu.grad(), w_cpu.grad());

        Tensor again = on_gpu(weight, true);
        embedding(again, on_gpu(idx), padding).backward(on_gpu(grad_out));
        CHECK_GPU_EXACT(again.grad(), w_gpu.grad().to(kCPU));
      }
    }
  }
}

TEST_CASE("gather on CUDA: every dim and dtype, index smaller than input, strided input, backward") {
  for (DType dtype : kAllDTypes) {
    CAPTURE(dtype);
    Tensor x = random_values({6, 7, 8}, dtype, 31);
    for (int64_t dim = 0; dim < 3; ++dim) {
      CAPTURE(dim);
      Shape shape{4, 5, 6};
      shape[dim] = 9;  // longer than x along dim: repeated reads
      Tensor idx = random_index(shape, x.shape()[dim], 40 + dim);
      Tensor expected = gather(x, dim, idx);
      CHECK_GPU_EXACT(gather(on_gpu(x), dim, on_gpu(idx)), expected);
      CHECK_GPU_EXACT(gather(noncontiguous(on_gpu(x)), dim, on_gpu(idx)), expected);
    }
  }
  Tensor x = random({6, 7, 8}, DType::Float64, 32);
  Tensor t_idx = random_index({5, 9, 4}, 7, 39);  // x.transpose(0, 2) is [8, 7, 6]
  CHECK_GPU_EXACT(gather(on_gpu(x).transpose(0, 2), 1, on_gpu(t_idx)), gather(x.transpose(0, 2), 1, t_idx));
  CHECK_GPU_EXACT(gather(on_gpu(x).slice(2, 1, 8, 3), 1, on_gpu(random_index({6, 4, 3}, 7, 33))),
                  gather(x.slice(2, 1, 8, 3), 1, random_index({6, 4, 3}, 7, 33)));
  CHECK_GPU_EXACT(gather(on_gpu(scalar_tensor(2.5)), 0, on_gpu(scalar_tensor(0, DType::Int64))),
                  scalar_tensor(2.5));
  Tensor big = random({1000003}, DType::Float32, 34);
  Tensor big_idx = random_index({1000003}, 1000003, 35);
  CHECK_GPU_EXACT(gather(on_gpu(big), 0, on_gpu(big_idx)), gather(big, 0, big_idx));
  CHECK(gather(on_gpu(x), 1, on_gpu(zeros({6, 0, 8}, DType::Int64))).shape() == Shape{6, 0, 8});

  for (DType dtype : kFloatDTypes) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      CAPTURE(dtype);
      CAPTURE(dim);
      Tensor base = random({6, 7, 8}, dtype, 36);
      Shape shape{5, 6, 7};
      shape[dim] = 20;
      Tensor idx = random_index(shape, base.shape()[dim], 37 + dim);
      Tensor x_cpu = base.detach().requires_grad_();
      Tensor out = gather(x_cpu, dim, idx);
      Tensor grad_out = random(out.shape(), dtype, 38);
      out.backward(grad_out);
      Tensor x_gpu = on_gpu(base, true);
      gather(x_gpu, dim, on_gpu(idx)).backward(on_gpu(grad_out));
      CHECK_GPU_EXACT(x_gpu.grad(), x_cpu.grad());
    }
  }
}

TEST_CASE("scatter_add on CUDA: every dim, numeric dtypes, src larger than index, long fibers, backward") {
  for (DType dtype : kNumericDTypes) {
    CAPTURE(dtype);
    Tensor x = random_values({5, 8, 6}, dtype, 51);
    for (int64_t dim = 0; dim < 3; ++dim) {
      CAPTURE(dim);
      Shape shape{3, 4, 5};
      shape[dim] = 12;  // longer than x along dim: repeated destinations
      Tensor idx = random_index(shape, x.shape()[dim], 60 + dim);
      Tensor src = random_values({shape[0] + 1, shape[1] + 1, shape[2] + 1}, dtype, 70 + dim);
      Tensor expected = scatter_add(x, dim, idx, src);
      CHECK_GPU_EXACT(scatter_add(on_gpu(x), dim, on_gpu(idx), on_gpu(src)), expected);
      CHECK_GPU_EXACT(scatter_add(noncontiguous(on_gpu(x)), dim, on_gpu(idx), noncontiguous(on_gpu(src))), expected);
    }
  }
  // Few, long fibers: 32 threads share a fiber, each owning a range of rows.
  for (int64_t dim = 0; dim < 2; ++dim) {
    CAPTURE(dim);
    Shape x_shape{100, 3}, idx_shape{5000, 3};
    if (dim == 1) x_shape = {3, 100}, idx_shape = {3, 5000};
    Tensor x = random(x_shape, DType::Float32, 80);
    Tensor idx = random_index(idx_shape, 100, 81);
    Tensor src = random(idx_shape, DType::Float32, 82);
    CHECK_GPU_EXACT(scatter_add(on_gpu(x), dim, on_gpu(idx), on_gpu(src)), scatter_add(x, dim, idx, src));
  }
  Tensor hot = tensor(std::vector<int64_t>(5000, 42), {5000, 1});  // one fiber, one destination
  Tensor ones_in = random({5000, 1}, DType::Float64, 83);
  Tensor col = random({100, 1}, DType::Float64, 84);
  CHECK_GPU_EXACT(scatter_add(on_gpu(col), 0, on_gpu(hot), on_gpu(ones_in)), scatter_add(col, 0, hot, ones_in));
  Tensor x = random({5, 8}, DType::Float64, 85);
  CHECK_GPU_EXACT(scatter_add(on_gpu(x), 1, on_gpu(zeros({5, 0}, DType::Int64)), on_gpu(random({5, 2}))), x);

  for (DType dtype : kFloatDTypes) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      CAPTURE(dtype);
      CAPTURE(dim);
      Shape shape{3, 4, 5};
      shape[dim] = 12;
      Tensor idx = random_index(shape, 6, 90 + dim);
      Tensor base = random({6, 6, 6}, dtype, 91);
      Tensor values = random({13, 13, 13}, dtype, 92);  // larger than the index in every dim
      Tensor x_cpu = base.detach().requires_grad_(), src_cpu = values.detach().requires_grad_();
      Tensor out = scatter_add(x_cpu, dim, idx, src_cpu);
      Tensor grad_out = random(out.shape(), dtype, 93);
      out.backward(grad_out);
      Tensor x_gpu = on_gpu(base, true), src_gpu = on_gpu(values, true);
      scatter_add(x_gpu, dim, on_gpu(idx), src_gpu).backward(on_gpu(grad_out));
      CHECK_GPU_EXACT(x_gpu.grad(), x_cpu.grad());
      CHECK_GPU_EXACT(src_gpu.grad(), src_cpu.grad());
    }
  }
}

// --- optimizers -------------------------------------------------------------------------

// 170 parameters: more than one launch's batch holds for every kernel (53 for Adam, 93
// for SGD, 153 for the norm and the scale), with empty, one-element and 1000003-element
// tensors (245 chunks) among them.
std::vector<Shape> param_shapes() {
  std::vector<Shape> shapes = {{1}, {7}, {33, 17}, {0}, {1000003}, {4, 4, 4}, {2, 0, 3}};
  for (int64_t i = 0; shapes.size() < 170; ++i) shapes.push_back({3 + (i * 37) % 500});
  return shapes;
}

// The same leaf parameters on both devices.
struct Params {
  std::vector<Tensor> cpu, gpu;
};

Params make_params(DType dtype, uint64_t seed) {
  Params p;
  const std::vector<Shape> shapes = param_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor values = random(shapes[i], dtype, seed + i);
    p.cpu.push_back(values.detach().clone().requires_grad_());
    p.gpu.push_back(on_gpu(values, true));
  }
  return p;
}

constexpr size_t kNoSkip = static_cast<size_t>(-1);

// Fresh gradients, the same on both devices; parameter `skip` gets none.
void set_grads(Params& p, DType dtype, uint64_t seed, size_t skip = kNoSkip) {
  for (size_t i = 0; i < p.cpu.size(); ++i) {
    if (i == skip) {
      p.cpu[i].set_grad(Tensor());
      p.gpu[i].set_grad(Tensor());
      continue;
    }
    Tensor g = random(p.cpu[i].shape(), dtype, seed * 1000 + i);
    p.cpu[i].set_grad(g);
    p.gpu[i].set_grad(on_gpu(g));
  }
}

struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(DType dtype) { return dtype == DType::Float64 ? Tolerance{1e-14, 1e-12} : Tolerance{1e-6, 1e-5}; }

void check_params(const Params& p, Tolerance tol) {
  for (size_t i = 0; i < p.cpu.size(); ++i) {
    CAPTURE(i);
    CHECK_GPU_MATCHES(p.gpu[i].detach(), p.cpu[i].detach(), tol.atol, tol.rtol);
  }
}

void check_state(const optim::Optimizer& gpu_opt, const optim::Optimizer& cpu_opt, Tolerance tol) {
  const optim::OptimizerState g = gpu_opt.state_dict(), c = cpu_opt.state_dict();
  REQUIRE(g.tensors.size() == c.tensors.size());
  for (size_t k = 0; k < c.tensors.size(); ++k) {
    CAPTURE(c.tensors[k].first);
    CHECK(g.tensors[k].first == c.tensors[k].first);
    CHECK(g.tensors[k].second.device() == gpu());
    CHECK_GPU_MATCHES(g.tensors[k].second, c.tensors[k].second, tol.atol, tol.rtol);
  }
  CHECK(g.scalars == c.scalars);
}

// Four steps on both devices from the same parameters and gradients; parameter 5 has
// no gradient in the third step (its Adam step count falls behind the others').
template <class Make>
void check_steps(DType dtype, const Make& make) {
  Params p = make_params(dtype, 100);
  std::unique_ptr<optim::Optimizer> cpu = make(p.cpu), gpu_opt = make(p.gpu);
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    set_grads(p, dtype, 7 + step, step == 2 ? 5 : kNoSkip);
    cpu->step();
    gpu_opt->step();
    check_params(p, tolerance(dtype));
    check_state(*gpu_opt, *cpu, tolerance(dtype));
  }
}

TEST_CASE("SGD on CUDA: momentum, nesterov, dampening, weight decay and maximize match the CPU") {
  const optim::SGDOptions variants[] = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.9, .nesterov = true},
      {.lr = 0.1, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01},
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05, .nesterov = true, .maximize = true},
      {.lr = 0.1, .weight_decay = 0.01, .maximize = true},
  };
  for (DType dtype : kFloatDTypes) {
    for (const optim::SGDOptions& o : variants) {
      CAPTURE(dtype);
      CAPTURE(o.momentum);
      CAPTURE(o.dampening);
      CAPTURE(o.weight_decay);
      CAPTURE(o.nesterov);
      CAPTURE(o.maximize);
      check_steps(dtype, [&](const std::vector<Tensor>& params) { return std::make_unique<optim::SGD>(params, o); });
    }
  }
}

TEST_CASE("Adam and AdamW on CUDA: weight decay, amsgrad and maximize match the CPU") {
  const optim::AdamOptions variants[] = {
      {.lr = 1e-2},
      {.lr = 1e-2, .weight_decay = 0.1},
      {.lr = 1e-2, .betas = {0.8, 0.99}, .eps = 1e-6, .amsgrad = true},
      {.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true, .maximize = true},
  };
  for (DType dtype : kFloatDTypes) {
    for (const optim::AdamOptions& o : variants) {
      CAPTURE(dtype);
      CAPTURE(o.weight_decay);
      CAPTURE(o.amsgrad);
      CAPTURE(o.maximize);
      check_steps(dtype, [&](const std::vector<Tensor>& params) { return std::make_unique<optim::Adam>(params, o); });
      const optim::AdamWOptions w(o.lr, o.betas, o.eps, o.weight_decay == 0 ? 1e-2 : o.weight_decay, o.amsgrad,
                                  o.maximize);
      check_steps(dtype, [&](const std::vector<Tensor>& params) { return std::make_unique<optim::AdamW>(params, w); });
    }
  }
}

TEST_CASE("fused optimizer steps on CUDA are repeatable bit for bit, for long and short lists") {
  for (size_t count : {size_t{170}, size_t{3}}) {
    CAPTURE(count);
    Params a = make_params(DType::Float32, 200), b = make_params(DType::Float32, 200);
    a.gpu.resize(count);
    b.gpu.resize(count);
    optim::AdamW adam_a(a.gpu, optim::AdamWOptions(1e-2, {0.9, 0.999}, 1e-8, 0.01, true));
    optim::AdamW adam_b(b.gpu, optim::AdamWOptions(1e-2, {0.9, 0.999}, 1e-8, 0.01, true));
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < count; ++i) {
        Tensor g = on_gpu(random(a.gpu[i].shape(), DType::Float32, 300 + step * 1000 + i));
        a.gpu[i].set_grad(g);
        b.gpu[i].set_grad(g.clone());
      }
      adam_a.step();
      adam_b.step();
    }
    for (size_t i = 0; i < count; ++i) CHECK_GPU_EXACT(a.gpu[i].detach(), b.gpu[i].detach().to(kCPU));
  }
}

TEST_CASE("clip_grad_norm_ on CUDA: norms 1, 2, 3.5 and inf over many gradients match the CPU") {
  for (DType dtype : kFloatDTypes) {
    for (double norm_type : {1.0, 2.0, 3.5, std::numeric_limits<double>::infinity()}) {
      CAPTURE(dtype);
      CAPTURE(norm_type);
      Params p = make_params(dtype, 400);
      set_grads(p, dtype, 11, 5);
      const double cpu_norm = optim::clip_grad_norm_(p.cpu, 1.0, norm_type).item();
      const Tensor gpu_result = optim::clip_grad_norm_(p.gpu, 1.0, norm_type);
      CHECK(gpu_result.device() == p.gpu[0].grad().device());  // the norm stays on the GPU
      const double gpu_norm = gpu_result.item();
      if (std::isinf(norm_type)) {
        CHECK(gpu_norm == cpu_norm);
      } else {
        CHECK(gpu_norm == doctest::Approx(cpu_norm).epsilon(1e-11));
      }
      CHECK(cpu_norm > 1.0);  // so the gradients were scaled
      for (size_t i = 0; i < p.cpu.size(); ++i) {
        if (i == 5) continue;
        CAPTURE(i);
        CHECK_GPU_MATCHES(p.gpu[i].grad(), p.cpu[i].grad(), dtype == DType::Float64 ? 1e-15 : 1e-9,
                          dtype == DType::Float64 ? 1e-12 : 1e-6);
      }
      // Without clipping (max_norm above the norm), twice: the same bits.
      const double first = optim::clip_grad_norm_(p.gpu, 1e300, norm_type).item();
      CHECK(optim::clip_grad_norm_(p.gpu, 1e300, norm_type).item() == first);
    }
  }
}

TEST_CASE("clip_grad_norm_ on CUDA: NaN and inf gradients, as on the CPU") {
  // PyTorch's (and the CPU kernel's) rule, test_optim.cpp: a NaN norm makes every gradient
  // NaN; an infinite norm scales by 0, so finite gradients become 0 and the infinite one NaN.
  auto grads_of = [](const std::vector<Tensor>& params) {
    std::vector<Tensor> grads;
    for (const Tensor& p : params) grads.push_back(p.grad().to(kCPU));
    return grads;
  };
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(norm_type);
    Params p = make_params(DType::Float32, 500);
    for (float poison : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
      CAPTURE(poison);
      set_grads(p, DType::Float32, 12);
      std::vector<float> values = p.cpu[4].grad().to_vector<float>();
      values[654321] = poison;
      p.cpu[4].set_grad(tensor(values, p.cpu[4].shape()));
      p.gpu[4].set_grad(on_gpu(p.cpu[4].grad()));
      CHECK_THROWS_AS(optim::clip_grad_norm_(p.gpu, 1.0, norm_type, true), weft::Error);
      CHECK_IDENTICAL(grads_of(p.gpu)[4], p.cpu[4].grad());  // the check scaled nothing

      const double max_norm = std::isnan(poison) ? 1.0 : 1e300;
      const double host = optim::clip_grad_norm_(p.cpu, max_norm, norm_type).item();
      const double dev = optim::clip_grad_norm_(p.gpu, max_norm, norm_type).item();
      const bool nan_norm = std::isnan(dev), inf_norm = std::isinf(dev);
      CHECK(nan_norm == std::isnan(poison));
      CHECK(inf_norm == std::isinf(poison));
      const bool same_norm = (std::isnan(host) && nan_norm) || host == dev;
      CHECK(same_norm);
      const std::vector<Tensor> scaled = grads_of(p.gpu);
      for (size_t i = 0; i < scaled.size(); ++i) CHECK_IDENTICAL(scaled[i], p.cpu[i].grad());
      CHECK(std::isnan(scaled[4].to_vector<float>()[654321]));
      const float first = scaled[0].to_vector<float>()[0];
      const bool first_as_expected = nan_norm ? std::isnan(first) : first == 0;
      CHECK(first_as_expected);
    }
  }
}

}  // namespace
