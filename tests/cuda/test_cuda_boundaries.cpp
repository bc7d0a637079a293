// CUDA kernels at their launch limits, against the CPU op or a closed form. For each kernel
// family of kernels/cuda, inputs that (a) make every grid-stride loop run at least twice,
// (b) cross every switch from 32-bit to 64-bit indexing, and (c) exceed the caps of a grid
// (more rows than the 65535 of a grid's y or z dimension, rows longer than a block, planes
// larger than a grid dimension). Each case says which limit it targets (file and constant);
// the constants live in the kernels' anonymous namespaces and are mirrored below.
//
// grid_size (kernels/cuda/copy.cu) launches at most 32 blocks per SM, so the cases that
// target it size their inputs from the SM count read at run time; the other kernels cap
// their grids at fixed block counts (kMaxGrid = 65536 in reduce.cu, softmax.cu, loss.cu).
//
// Cases named "2^31" hold more than 2^31 elements (uint8 or bool, stride-0 or overlapping
// views; at most 4 GiB of GPU memory each) and check closed forms on the host, every byte;
// tools/gpu-check leaves them out of the sanitizer runs. Not reached under about 6 GiB, so
// read rather than run: the switches of batch_norm_kernels.cu (N * C * S <= INT32_MAX, float
// only: 8 GiB of input) and loss.cu (kMaxUint32Index: 2^32 elements of float, 16 GiB), and
// float-only kernels past 2^31 elements (softmax, dropout, the optimizers), which index with
// int64_t throughout. reduce.cu's fold_kernel never loops: it runs only with splits > 1,
// i.e. with fewer than kTargetBlocks = 2048 rows or tiles, so with fewer than 2048 * 256
// outputs, below the 65536 blocks * 8 warps that would make it loop.
//
// Tolerances: the family suites' tables (cuda_tolerances.h); exact where the family is.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "cuda_tolerances.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/runtime.h"
#include "kernels/elementwise_kernels.h"
#include "kernels/index_ops_kernels.h"
#include "kernels/random_kernels.h"

using namespace weft;
using test::gpu;
using test::on_gpu;
namespace tolerance = test::tolerance;

namespace {

// --- the kernels' limits ----------------------------------------------------------------

constexpr int64_t kBlockSize = 256;            // loops.cuh kBlockSize: for_each_index, elementwise, dropout, ...
constexpr int64_t kBlocksPerSm = 32;           // copy.cu grid_size: at most 32 blocks per SM
constexpr int64_t kMaxGrid = int64_t{1} << 16;  // reduce.cu, softmax.cu, loss.cu kMaxGrid
constexpr int64_t kPacketBytes = 16;           // elementwise.cu / dropout.cu kPacketBytes
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int sm_count() {
  static const int count = [] {
    int sms = 0;
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda::physical_device(gpu())));
    return sms;
  }();
  return count;
}

// The items one grid of grid_size covers: 32 blocks per SM of `per_block` items each. A loop
// over more than twice as many runs at least twice in every thread.
int64_t grid_items(int64_t per_block) { return int64_t{sm_count()} * kBlocksPerSm * per_block; }
int64_t past_two_grids(int64_t per_block) { return 2 * grid_items(per_block) + 7; }

const DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool};

// The gradient of sum(fn(x) * w) with respect to x, on `device` (w fresh random, the same on both).
Tensor grad_through(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, Device device, uint64_t seed) {
  Tensor leaf = x.detach().to(device).requires_grad_();
  Tensor out = fn(leaf);
  sum(mul(out, test::random(out.shape(), out.dtype(), seed).to(device))).backward();
  return leaf.grad();
}

// Class indices in [0, c), every third one `ignored`.
Tensor random_targets(const Shape& shape, int64_t c, uint64_t seed, int64_t ignored) {
  const std::vector<double> u =
      test::random(shape, DType::Float64, seed, 0, static_cast<double>(c)).to_vector<double>();
  std::vector<int64_t> t(u.size());
  for (size_t i = 0; i < u.size(); ++i) t[i] = i % 3 == 1 ? ignored : static_cast<int64_t>(u[i]);
  return tensor(t, shape);
}

// A host uint8 tensor [n] with values (i * step + shift) mod `modulo`.
Tensor byte_pattern(int64_t n, int64_t step, int64_t shift, int64_t modulo = 256) {
  Tensor t = empty({n}, DType::UInt8);
  uint8_t* p = t.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * step + shift) % modulo);
  return t;
}

// "" when every byte of the [rows, cols] tensor t (read back to the host) equals want(r, c),
// else the first that does not: the whole output is checked, however large.
template <class T, class Want>
std::string first_wrong(const Tensor& t, int64_t rows, int64_t cols, const Want& want) {
  const Tensor host = t.to(kCPU).contiguous();
  const T* p = host.data_ptr<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = p + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      if (row[c] != want(r, c)) {
        std::ostringstream out;
        out << "element (" << r << ", " << c << ") = flat " << r * cols + c << ": " << +row[c] << ", expected "
            << +want(r, c);
        return out.str();
      }
    }
  }
  return "";
}

// Gives the allocator's cached blocks back to the GPU, so that a case of several large steps
// holds only what its current step uses.
void release_cached() { cuda::empty_cache(gpu()); }

#define CHECK_EMPTY(message)                                  \
  do {                                                        \
    const std::string weft_message_ = (message);              \
    CHECK_MESSAGE(weft_message_.empty(), weft_message_);      \
  } while (0)

// A shape reduced (or normalised) along `dim`, and the kernel path it takes.
struct DimCase {
  Shape shape;
  int64_t dim;
  const char* path;
};

}  // namespace

// --- (a) and (c): grid-stride loops and grid caps, per family ----------------------------

TEST_CASE("elementwise: packet and indexed kernels loop past the grid of grid_size") {
  // elementwise.cu launch(): packet_kernel and indexed_kernel<uint32_t> both run grid_size(n)
  // blocks of kBlockSize (copy.cu: at most 32 per SM).
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const int64_t lanes = kPacketBytes / element_size(dtype);
    // Two grids of 16-byte packets, and a tail of lanes - 1 elements (packet_kernel's n % lanes).
    const int64_t n = lanes * past_two_grids(kBlockSize) + lanes - 1;
    const Tensor a = test::random({n}, dtype, 1), b = test::random({n}, dtype, 2);
    const Tensor ga = on_gpu(a), gb = on_gpu(b);
    CHECK_IDENTICAL(add(ga, gb), add(a, b));
    CHECK_IDENTICAL(mul(ga, gb.slice(0, 5, 6)), mul(a, b.slice(0, 5, 6)));  // a one-element operand, broadcast
    CHECK_IDENTICAL(mul(ga, -2.5), mul(a, -2.5));                          // unary Affine
    CHECK_WITHIN(exp(ga), exp(a), tolerance::transcendental(dtype));
    // indexed_kernel<uint32_t> with its divisions: a transposed operand against a row.
    const int64_t cols = 1031, rows = past_two_grids(kBlockSize) / cols + 1;
    const Tensor m = test::random({cols, rows}, dtype, 3), row = test::random({cols}, dtype, 4);
    const Tensor gm = on_gpu(m).t(), grow = on_gpu(row);
    CHECK_IDENTICAL(sub(gm, grow), sub(m.t(), row));
    CHECK_IDENTICAL(lt(gm, grow), lt(m.t(), row));
    CHECK_IDENTICAL(where(lt(gm, grow), gm, grow), where(lt(m.t(), row), m.t(), row));
  }
}

TEST_CASE("copies: converting and strided copy_ and fill_ loop past the grid of grid_size") {
  // copy.cu copy_on_stream -> launch_convert and fill_kernel -> launch_fill: for_each_index
  // (loops.cuh) over grid_size(n) blocks of kBlockSize.
  const int64_t cols = 1031, rows = past_two_grids(kBlockSize) / cols + 1;
  const Tensor src = test::random({cols, rows}, DType::Float64, 5, -300, 300);
  const Tensor gsrc = on_gpu(src);
  for (DType to : kAllDTypes) {
    CAPTURE(to);
    CHECK_IDENTICAL(gsrc.t().to(to).contiguous(), src.t().to(to).contiguous());
  }
  // A contiguous source into a transposed, poisoned destination of another dtype.
  const Tensor flat = test::random({rows, cols}, DType::Float64, 6);
  Tensor dst = test::poisoned({cols, rows}, DType::Float32, gpu()).t();
  dst.copy_(on_gpu(flat));
  CHECK_IDENTICAL(dst, flat.to(DType::Float32));
  // A stride-0 source.
  const Tensor line = test::random({1, cols}, DType::Float64, 7, -50, 50).to(DType::Int32);
  CHECK_IDENTICAL(on_gpu(line).expand({rows, cols}).contiguous(), line.expand({rows, cols}).contiguous());
  // fill_ of every other element; the others keep their poison.
  const int64_t n = past_two_grids(kBlockSize);
  Tensor every_other = test::poisoned({2 * n}, DType::Float32, gpu());
  fill_(every_other.slice(0, 0, 2 * n, 2), 1.5);
  Tensor expected = test::poisoned({2 * n}, DType::Float32, kCPU);
  fill_(expected.slice(0, 0, 2 * n, 2), 1.5);
  CHECK_IDENTICAL(every_other, expected);
}

TEST_CASE("copies across logical devices loop past the grid of grid_size") {
  // copy.cu copy_kernel (Note [Copies across logical devices]): on one GPU launch_convert reads
  // the other device's memory; on two GPUs the bytes are staged and go by cudaMemcpyPeerAsync.
  if (cuda::device_count() < 2) {
    MESSAGE("one logical device: run with WEFT_VIRTUAL_DEVICES=4 to cover cross-device copies");
    return;
  }
  const int64_t cols = 1031, rows = past_two_grids(kBlockSize) / cols + 1;
  const Tensor src = test::random({cols, rows}, DType::Float64, 8);
  const Tensor on0 = src.to(gpu(0));
  // Transposed and converted on the way.
  Tensor dst = test::poisoned({rows, cols}, DType::Float32, gpu(1)).t();
  dst.copy_(on0);
  CHECK_IDENTICAL(dst, src.to(DType::Float32));
  // And back into a transposed destination on cuda:0, from a contiguous source on cuda:1.
  Tensor back = test::poisoned({rows, cols}, DType::Float64, gpu(0)).t();
  back.copy_(on0.to(gpu(1)));
  CHECK_IDENTICAL(back, src);
  CHECK_IDENTICAL(on0.to(gpu(1)).to(gpu(0)), src);
}

TEST_CASE("reductions: row and column kernels loop past kMaxGrid blocks") {
  // reduce.cu: every launch is grid_for(blocks) = min(blocks, kMaxGrid = 65536) blocks of
  // kThreads = 256, looping over units: 64 rows per block for rows of <= 16 (4 lanes each),
  // 8 for rows of <= 1024 (a warp each), one longer row, or one column tile per block.
  const std::vector<DimCase> cases = {
      {{64 * kMaxGrid + 5, 3}, 1, "4-lane rows, 64 per block"},
      {{8 * kMaxGrid + 3, 17}, 1, "warp rows, 8 per block"},
      {{kMaxGrid + 3, 1029}, 1, "block rows: more than a grid's 65535 in y or z; misaligned rows"},
      {{kMaxGrid + 4465, 3, 2}, 1, "columns: one 64 x 4 tile per block"},
  };
  for (const DimCase& c : cases) {
    CAPTURE(c.path);
    // int32 with many ties: sums, extrema and first indices exact.
    const Tensor xi = test::random(c.shape, DType::Float64, 9, -1000, 1000).to(DType::Int32);
    const Tensor gi = on_gpu(xi);
    CHECK_IDENTICAL(sum(gi, {c.dim}), sum(xi, {c.dim}));
    CHECK_IDENTICAL(amax(gi, {c.dim}), amax(xi, {c.dim}));
    CHECK_IDENTICAL(argmin(gi, c.dim), argmin(xi, c.dim));
    // float32: means and both passes of var.
    const Tensor xf = test::random(c.shape, DType::Float32, 10);
    const Tensor gf = on_gpu(xf);
    const tolerance::Tol t = tolerance::sums(DType::Float32, c.shape[c.dim]);
    CHECK_WITHIN(mean(gf, {c.dim}), mean(xf, {c.dim}), t);
    CHECK_WITHIN(var(gf, {c.dim}), var(xf, {c.dim}), t);
  }
}

TEST_CASE("softmax and log_softmax: row and column kernels loop past kMaxGrid blocks; rows longer than a block") {
  // softmax.cu launch(): grid_for(blocks) = min(blocks, kMaxGrid = 65536) blocks of kThreads =
  // 256: 64 rows per block (n <= 16), 8 (n <= 1024), one longer row, or one column tile.
  const std::vector<DimCase> cases = {
      {{64 * kMaxGrid + 5, 3}, 1, "4-lane rows, 64 per block"},
      {{8 * kMaxGrid + 3, 17}, 1, "warp rows, 8 per block"},
      {{kMaxGrid + 3, 1025}, 1, "block rows: more than a grid's 65535 in y or z"},
      {{kMaxGrid + 4465, 3, 2}, 1, "columns: one 64 x 4 tile per block"},
      {{2, 100003}, 1, "rows of 391 elements per thread of a block"},
      {{3, 2000, 5}, 1, "column tiles of 8 x 32 whose rows take 63 elements each"},
  };
  const tolerance::Tol t = tolerance::math(DType::Float32);
  for (size_t i = 0; i < cases.size(); ++i) {
    // log_softmax for every other case (the CPU reference of the large ones takes seconds).
    const bool log = i % 2 == 1;
    const int64_t dim = cases[i].dim;
    CAPTURE(cases[i].path);
    CAPTURE(log);
    auto fn = [log, dim](const Tensor& v) { return log ? log_softmax(v, dim) : softmax(v, dim); };
    const Tensor x = mul(test::random(cases[i].shape, DType::Float32, 11), 3.0);
    CHECK_WITHIN(fn(on_gpu(x)), fn(x), t);
    CHECK_WITHIN(grad_through(fn, x, gpu(), 12), grad_through(fn, x, kCPU, 12), t);
  }
}

TEST_CASE("index ops: select, gather, scatter_add, index_add and the range scan loop past their grids") {
  // index_ops.cu: index_select_rows runs grid_size(rows, 256 >> row_shift) blocks (a row of
  // inner 1 per thread: 256 rows per block; inner 3 takes 4 threads: 64 per block);
  // gather_elements grid_size(numel) of kBlockSize; scatter_add_owned grid_size(fibers *
  // parts, kScatterThreads = 256); index_add_owned grid_size(tasks, kAddWarps = 8), a warp
  // per task; index_range_partials min(n / 1024, kRangeMaxBlocks = 1024) blocks of 256.
  const Tensor x1 = test::random({7}, DType::Float64, 13);
  {
    const int64_t k = past_two_grids(256);
    const Tensor idx = test::random({k}, DType::Float64, 14, 0, 7).to(DType::Int64);
    auto fn = [&idx](const Tensor& v) { return index_select(v, 0, idx.to(v.device())); };
    CHECK_IDENTICAL(fn(on_gpu(x1)), fn(x1));
    CHECK_IDENTICAL(grad_through(fn, x1, gpu(), 15), grad_through(fn, x1, kCPU, 15));
  }
  {
    const Tensor x = test::random({5, 3}, DType::Float64, 16);
    const int64_t k = past_two_grids(64);
    const Tensor idx = test::random({k}, DType::Float64, 17, 0, 5).to(DType::Int64);
    CHECK_IDENTICAL(index_select(on_gpu(x), 0, on_gpu(idx)), index_select(x, 0, idx));
    const Tensor gidx =
        test::random({past_two_grids(kBlockSize) / 3 + 1, 3}, DType::Float64, 18, 0, 5).to(DType::Int64);
    auto fn = [&gidx](const Tensor& v) { return gather(v, 0, gidx.to(v.device())); };
    CHECK_IDENTICAL(fn(on_gpu(x)), fn(x));
    CHECK_IDENTICAL(grad_through(fn, x, gpu(), 19), grad_through(fn, x, kCPU, 19));
  }
  {
    // scatter_add: one thread per fiber (fibers of 2, too short to split) over two grids of fibers.
    const int64_t fibers = past_two_grids(256);
    const Tensor x = test::random({5, fibers}, DType::Float64, 20);
    const Tensor src = test::random({2, fibers}, DType::Float64, 21);
    const Tensor idx = test::random({2, fibers}, DType::Float64, 22, 0, 5).to(DType::Int64);
    CHECK_IDENTICAL(scatter_add(on_gpu(x), 0, on_gpu(idx), on_gpu(src)), scatter_add(x, 0, idx, src));
  }
  {
    // index_add (index_select's backward): one task per outer row, two grids of warps.
    const int64_t outer = past_two_grids(8);
    const Tensor x = test::random({outer, 3, 1}, DType::Float64, 23);
    const Tensor idx = tensor(std::vector<int64_t>{2, 0, 2, 1});
    auto fn = [&idx](const Tensor& v) { return index_select(v, 1, idx.to(v.device())); };
    CHECK_IDENTICAL(grad_through(fn, x, gpu(), 24), grad_through(fn, x, kCPU, 24));
  }
  {
    // The range scan: bad entries after the first pass of every thread; the first one is named.
    std::vector<int64_t> values(4 * 262144 + 11, 3);
    values[2 * 262144 + 7] = 9;
    values[3 * 262144 + 1] = -1;
    CHECK_THROWS_WITH_AS(index_select(on_gpu(x1), 0, on_gpu(tensor(values))).to(kCPU),
                         doctest::Contains("index 9 at"), weft::Error);
    CHECK_THROWS_WITH_AS(index_select(on_gpu(x1), 0, on_gpu(tensor(values))).to(kCPU), doctest::Contains("524295"),
                         weft::Error);
  }
}

TEST_CASE("cross_entropy, nll_loss and mse_loss: row, column and elementwise kernels loop past their grids") {
  // loss.cu: cross_entropy_rows_kernel runs grid_for(blocks) <= kMaxGrid = 65536 blocks of 64
  // rows (C <= 16, 4 lanes each), 8 rows (C <= 2048, a warp) or one row (a block); the
  // columns kernel, nll_forward / nll_backward, cross_entropy_backward, squared_error and
  // mse_backward run grid_size(n) blocks of kThreads = 256.
  const int64_t positions = past_two_grids(256);
  const std::vector<Shape> shapes = {
      {64 * kMaxGrid + 5, 3}, {8 * kMaxGrid + 3, 17}, {kMaxGrid + 3, 2049}, {1, 3, positions}};
  const tolerance::Tol t = tolerance::math(DType::Float32);
  uint64_t seed = 30;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& shape = shapes[i];
    // Label smoothing for every other shape (the CPU reference of the large ones takes seconds).
    const double smoothing = i % 2 == 1 ? 0.1 : 0.0;
    CAPTURE(shape);
    CAPTURE(smoothing);
    const int64_t c = shape[1];
    Shape target_shape = shape;
    target_shape.erase(1);
    const Tensor logits = mul(test::random(shape, DType::Float32, ++seed), 2.0);
    const Tensor target = random_targets(target_shape, c, ++seed, -100);
    const Tensor weight = test::random({c}, DType::Float32, ++seed, 0.5, 2.0);
    auto ce = [&target, &weight, smoothing](const Tensor& v) {
      return cross_entropy(v, target.to(v.device()), Reduction::None, -100, weight.to(v.device()), smoothing);
    };
    CHECK_WITHIN(ce(on_gpu(logits)), ce(logits), t);
    const uint64_t weights = ++seed;
    CHECK_WITHIN(grad_through(ce, logits, gpu(), weights), grad_through(ce, logits, kCPU, weights), t);
  }
  // nll_loss: a thread per position forward, per element backward.
  seed += 10;
  const Tensor lp = log_softmax(test::random({positions, 2}, DType::Float32, seed), 1);
  const Tensor target = random_targets({positions}, 2, seed, -100);
  auto nll = [&target](const Tensor& v) { return nll_loss(v, target.to(v.device()), Reduction::None); };
  CHECK_WITHIN(nll(on_gpu(lp)), nll(lp), t);
  CHECK_WITHIN(grad_through(nll, lp, gpu(), seed + 1), grad_through(nll, lp, kCPU, seed + 1), t);
  // mse_loss without reduction: squared_error_kernel and mse_backward_kernel.
  const Tensor a = test::random({positions}, DType::Float32, seed + 2);
  const Tensor b = test::random({positions}, DType::Float32, seed + 3);
  auto mse = [&b](const Tensor& v) { return mse_loss(v, b.to(v.device()), Reduction::None); };
  CHECK_WITHIN(mse(on_gpu(a)), mse(a), t);
  CHECK_WITHIN(grad_through(mse, a, gpu(), seed + 4), grad_through(mse, a, kCPU, seed + 4), t);
}

TEST_CASE("pooling: kernels loop past the grid of grid_size; the max scatter over many planes and huge planes") {
  // pooling_kernels.cu: the forwards and the average backwards are for_each_index (grid_size(n)
  // blocks of kBlockSize); scatter_max_grad runs grid_size(planes * 32) blocks, a warp per
  // plane (8 * 32 warps per SM), walking the plane 32 outputs at a time.
  struct Case {
    Shape shape;
    const char* what;
  };
  // Two planes of (side - 1)^2 > one grid of outputs each (a million or so: far more than the
  // 65535 of a grid dimension), which one warp walks alone; then two grids of planes.
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(grid_items(kBlockSize)))) + 2;
  const std::vector<Case> cases = {
      {{1, 2, side, side}, "two grids of outputs; planes of a grid of outputs each"},
      {{2 * int64_t{sm_count()} * 8 * 32 + 3, 1, 4, 5}, "two grids of warps, one per plane"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const Tensor x = test::random(c.shape, DType::Float32, 40);
    auto max_pool = [](const Tensor& v) { return max_pool2d(v, {2, 2}, {1, 1}); };  // overlapping windows
    auto avg_pool = [](const Tensor& v) { return avg_pool2d(v, {3, 2}, {1, 1}, {1, 1}, true, false); };
    auto adaptive = [](const Tensor& v) { return adaptive_avg_pool2d(v, {v.size(2) - 1, 3}); };
    const Tensor gx = on_gpu(x);
    const std::pair<Tensor, Tensor> dev = max_pool2d_with_indices(gx, {2, 2}, {1, 1});
    const std::pair<Tensor, Tensor> host = max_pool2d_with_indices(x, {2, 2}, {1, 1});
    CHECK_IDENTICAL(dev.first, host.first);
    CHECK_IDENTICAL(dev.second, host.second);
    CHECK_IDENTICAL(grad_through(max_pool, x, gpu(), 41), grad_through(max_pool, x, kCPU, 41));
    CHECK_IDENTICAL(avg_pool(gx), avg_pool(x));
    CHECK_IDENTICAL(grad_through(avg_pool, x, gpu(), 42), grad_through(avg_pool, x, kCPU, 42));
    CHECK_IDENTICAL(adaptive(gx), adaptive(x));
    CHECK_IDENTICAL(grad_through(adaptive, x, gpu(), 43), grad_through(adaptive, x, kCPU, 43));
  }
}

TEST_CASE("batch_norm: more channels than two grids; one channel in kTargetBlocks chunks") {
  // batch_norm_kernels.cu: channel_sums_kernel runs one block per (channel, chunk), chunks =
  // min(N * S / kMinChunk, kTargetBlocks / C) with kMinChunk = 4096 and kTargetBlocks = 1024;
  // the per-channel passes are for_each_index over C and channel_map_kernel<uint32_t> over
  // N * C * S (grid_size blocks of kBlockSize).
  const std::vector<Shape> shapes = {{2, past_two_grids(kBlockSize)}, {64, 1, 65536}};
  for (const Shape& shape : shapes) {
    CAPTURE(shape);
    const int64_t c = shape[1];
    const double tol = tolerance::batch_norm_normalised(DType::Float32);
    const Tensor x = mul(test::random(shape, DType::Float32, 50), 2.0);
    const Tensor w = test::random({c}, DType::Float32, 51), b = test::random({c}, DType::Float32, 52);
    const Tensor mean_cpu = test::random({c}, DType::Float32, 53);
    const Tensor var_cpu = test::random({c}, DType::Float32, 54, 0.5, 2);
    const Tensor mean_gpu = on_gpu(mean_cpu).clone(), var_gpu = on_gpu(var_cpu).clone();
    auto run = [&](Device d, const Tensor& rm, const Tensor& rv, bool training) {
      Tensor leaf = x.detach().to(d).requires_grad_();
      Tensor wd = w.detach().to(d).requires_grad_(), bd = b.detach().to(d).requires_grad_();
      Tensor out = batch_norm(leaf, rm, rv, wd, bd, training, 0.1, 1e-5);
      sum(mul(out, test::random(out.shape(), DType::Float32, 55).to(d))).backward();
      return std::vector<Tensor>{out, leaf.grad(), wd.grad(), bd.grad()};
    };
    for (bool training : {true, false}) {
      CAPTURE(training);
      const std::vector<Tensor> dev = run(gpu(), mean_gpu, var_gpu, training);
      const std::vector<Tensor> host = run(kCPU, mean_cpu, var_cpu, training);
      for (size_t i = 0; i < dev.size(); ++i) {
        CAPTURE(i);
        CHECK_NORMALISED_WITHIN(dev[i], host[i], tol);
      }
      CHECK_NORMALISED_WITHIN(mean_gpu, mean_cpu, tol);
      CHECK_NORMALISED_WITHIN(var_gpu, var_cpu, tol);
    }
  }
}

TEST_CASE("dropout: packet and strided kernels loop past the grid of grid_size") {
  // dropout.cu dropout_typed(): dropout_packet_kernel runs grid_size(packets) and
  // dropout_strided_kernel grid_size(n) blocks of kBlockSize; the same generator state gives
  // the CPU's mask, output and gradient bit for bit (test_cuda_elementwise.cpp).
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    const int64_t lanes = kPacketBytes / element_size(dtype);
    const Tensor flat = test::random({lanes * past_two_grids(kBlockSize) + lanes - 1}, dtype, 60);
    const int64_t cols = 1031, rows = past_two_grids(kBlockSize) / cols + 1;
    const Tensor m = test::random({cols, rows}, dtype, 61);
    Generator cg(62), gg(62);
    CHECK_IDENTICAL(dropout(on_gpu(flat), 0.3, true, &gg), dropout(flat, 0.3, true, &cg));
    CHECK_IDENTICAL(dropout(on_gpu(m).t(), 0.6, true, &gg), dropout(m.t(), 0.6, true, &cg));
    CHECK(gg.offset() == cg.offset());
  }
}

TEST_CASE("random fills: Philox blocks loop past the grid of grid_size; the counter carries past 2^32") {
  // random.cu fill(): random_kernel runs grid_size(blocks) of kBlockSize, one Philox block
  // (4 / words-per-element values) per thread per pass, counter first + k as 64 bits.
  const int64_t blocks = past_two_grids(kBlockSize);
  Generator gg(70), cg(70);
  CHECK_IDENTICAL(rand({4 * blocks + 3}, TensorOptions(DType::Float32, gpu()), &gg),
                  rand({4 * blocks + 3}, DType::Float32, &cg));
  CHECK_IDENTICAL(rand({2 * blocks + 1}, TensorOptions(DType::Float64, gpu()), &gg),
                  rand({2 * blocks + 1}, DType::Float64, &cg));
  CHECK_IDENTICAL(randint(-5, 1000, {2 * blocks + 1}, TensorOptions(DType::Int64, gpu()), &gg),
                  randint(-5, 1000, {2 * blocks + 1}, DType::Int64, &cg));
  // Normals: log and cos from different libraries (the transcendental table).
  CHECK_WITHIN(randn({blocks}, TensorOptions(DType::Float64, gpu()), &gg), randn({blocks}, DType::Float64, &cg),
               tolerance::transcendental(DType::Float64));
  CHECK(gg.offset() == cg.offset());
  // Counters 2^32 - 100 .. 2^32 + 150: the carry into Philox's second counter word.
  Generator g2(71), c2(71);
  g2.set_offset((uint64_t{1} << 32) - 100);
  c2.set_offset((uint64_t{1} << 32) - 100);
  CHECK_IDENTICAL(rand({1001}, TensorOptions(DType::Float32, gpu()), &g2), rand({1001}, DType::Float32, &c2));
}

TEST_CASE("optimizer steps and clip_grad_norm_: launches split exactly at a batch's capacity") {
  // optim.cu TensorBatch<Depth, Extra>::kCapacity: 53 tensors per launch for Adam (5 lists), 93
  // for SGD (3), 153 for the norm and the scale (1); each tensor of kChunk + 1 = 4097 elements
  // is two blocks, so 154 of them leave 308 partials for norm_final's 256 threads.
  const tolerance::Tol t = tolerance::optimizer(DType::Float32);
  auto make = [](size_t count, uint64_t seed) {
    std::pair<std::vector<Tensor>, std::vector<Tensor>> p;
    for (size_t i = 0; i < count; ++i) {
      const Tensor v = test::random({4097}, DType::Float32, seed + i);
      p.first.push_back(v.clone().requires_grad_());
      p.second.push_back(on_gpu(v, true));
    }
    return p;
  };
  auto set_grads = [](std::pair<std::vector<Tensor>, std::vector<Tensor>>& p, uint64_t seed) {
    for (size_t i = 0; i < p.first.size(); ++i) {
      const Tensor g = test::random({4097}, DType::Float32, seed * 1000 + i);
      p.first[i].set_grad(g);
      p.second[i].set_grad(on_gpu(g));
    }
  };
  auto check_params = [&t](const std::pair<std::vector<Tensor>, std::vector<Tensor>>& p) {
    for (size_t i = 0; i < p.first.size(); ++i) {
      CAPTURE(i);
      CHECK_WITHIN(p.second[i].detach(), p.first[i].detach(), t);
    }
  };
  for (size_t count : {size_t{52}, size_t{53}, size_t{54}}) {
    CAPTURE(count);
    auto p = make(count, 100);
    optim::Adam cpu(p.first, {.lr = 1e-2, .amsgrad = true}), dev(p.second, {.lr = 1e-2, .amsgrad = true});
    for (int step = 0; step < 2; ++step) {
      set_grads(p, 7 + step);
      cpu.step();
      dev.step();
    }
    check_params(p);
  }
  for (size_t count : {size_t{92}, size_t{93}, size_t{94}}) {
    CAPTURE(count);
    auto p = make(count, 200);
    optim::SGD cpu(p.first, {.lr = 0.1, .momentum = 0.9}), dev(p.second, {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 2; ++step) {
      set_grads(p, 9 + step);
      cpu.step();
      dev.step();
    }
    check_params(p);
  }
  for (size_t count : {size_t{152}, size_t{153}, size_t{154}}) {
    for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
      CAPTURE(count);
      CAPTURE(norm_type);
      auto p = make(count, 300);
      set_grads(p, 11);
      const double cpu_norm = optim::clip_grad_norm_(p.first, 1.0, norm_type).item();
      const double dev_norm = optim::clip_grad_norm_(p.second, 1.0, norm_type).item();
      CHECK(dev_norm == doctest::Approx(cpu_norm).epsilon(1e-11));
      for (size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        CHECK_WITHIN(p.second[i].grad(), p.first[i].grad(), t);
      }
    }
  }
}

// --- (b): more than 2^31 elements ------------------------------------------------------------
// Every case here checks each byte of its outputs on the host against a closed form.

TEST_CASE("2^31: elementwise indexed kernels on both sides of INT32_MAX") {
  release_cached();
  // elementwise.cu launch(): indexed_kernel<uint32_t> while n <= INT32_MAX, <int64_t> beyond.
  // Out [rows, 32769] uint8 from a Hankel view (strides 1, 1: a[r, c] = base[r + c]) and a
  // stride-0 row, so the indexer keeps two dims and divides: 65534 rows is 2^31 - 2 elements
  // (32-bit), 65536 rows is 2^31 + 65536 (64-bit). The output is poisoned (255) first, and no
  // result reaches 255 (both operands are below 100).
  const int64_t cols = 32769;
  for (int64_t rows : {int64_t{65534}, int64_t{65536}}) {
    CAPTURE(rows);
    release_cached();
    const Tensor base = byte_pattern(rows + cols - 1, 37, 11, 100), line = byte_pattern(cols, 13, 5, 100);
    const Tensor a = on_gpu(base).as_strided({rows, cols}, {1, 1}, 0);
    const Tensor b = on_gpu(line).view({1, cols}).expand({rows, cols});
    Tensor out = full({rows, cols}, 255, TensorOptions(DType::UInt8, gpu()));
    binary_stub(gpu(), BinaryOp::Add, a, b, out);
    const uint8_t* pa = base.data_ptr<uint8_t>();
    const uint8_t* pb = line.data_ptr<uint8_t>();
    CHECK_EMPTY(first_wrong<uint8_t>(out, rows, cols, [pa, pb](int64_t r, int64_t c) {
      return static_cast<uint8_t>(pa[r + c] + pb[c]);
    }));
  }
  // One dim (the indexer's contiguous branch): exactly INT32_MAX elements, the most the 32-bit
  // kernel takes, and INT32_MAX + 1; out = -x of a stride-0 scalar.
  for (int64_t n : {kInt32Max, kInt32Max + 1}) {
    CAPTURE(n);
    release_cached();
    const Tensor x = full({1}, 3, TensorOptions(DType::UInt8, gpu())).expand({n});
    Tensor out = full({n}, 255, TensorOptions(DType::UInt8, gpu()));
    unary_stub(gpu(), UnaryOp::Neg, x, out, 0, 0);
    CHECK_EMPTY(first_wrong<uint8_t>(out, 1, n, [](int64_t, int64_t) { return uint8_t{253}; }));
  }
}

TEST_CASE("2^31: copies, dtype conversion, fill_ and the packet path past 2^31 elements") {
  release_cached();
  // copy.cu launch_convert and launch_fill: for_each_index (loops.cuh) with int64_t indices;
  // elementwise.cu packet_kernel with int64_t packet indices. 65536 x 32769 uint8 is
  // 2^31 + 65536 elements; a Hankel source (strides 1, 1) keeps the copy's indexer 2-d.
  const int64_t rows = 65536, cols = 32769;
  const Tensor base = byte_pattern(rows + cols - 1, 37, 11);
  const uint8_t* pb = base.data_ptr<uint8_t>();
  Tensor y = on_gpu(base).as_strided({rows, cols}, {1, 1}, 0).contiguous();
  CHECK_EMPTY(first_wrong<uint8_t>(y, rows, cols, [pb](int64_t r, int64_t c) { return pb[r + c]; }));
  // In place, 16 lanes of uint8 per packet: y = 3 * y (wrapping).
  mul_(y, 3.0);
  CHECK_EMPTY(first_wrong<uint8_t>(y, rows, cols, [pb](int64_t r, int64_t c) { return uint8_t(3 * pb[r + c]); }));
  // uint8 -> bool, contiguous (one dim).
  const Tensor z = y.to(DType::Bool);
  CHECK_EMPTY(first_wrong<bool>(z, rows, cols, [pb](int64_t r, int64_t c) { return uint8_t(3 * pb[r + c]) != 0; }));
  // fill_ with a value other than 0 (a zero fill is a memset).
  fill_(y, 200.0);
  CHECK_EMPTY(first_wrong<uint8_t>(y, rows, cols, [](int64_t, int64_t) { return uint8_t{200}; }));
}

TEST_CASE("2^31: row and column reductions whose offsets pass 2^31") {
  release_cached();
  // reduce.cu reads in[(o * inner + i) * post + p] with int64_t offsets. x is [65537, 32769]
  // uint8 (2^31 + 98305 elements), zero but for a 9 at (r, (7919 r + 5) mod 32769) in every
  // row: rows (post 1) are one block each, 65537 of them, past kMaxGrid too; columns (post
  // 32769) are 32-wide tiles split in two segments of 32769 rows, folded by fold_kernel.
  const int64_t rows = 65537, cols = 32769;
  std::vector<int64_t> marker(rows), first(cols, -1), count(cols, 0);
  Tensor host = zeros({rows, cols}, DType::UInt8);
  uint8_t* p = host.data_ptr<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    marker[r] = (7919 * r + 5) % cols;
    p[r * cols + marker[r]] = 9;
    if (first[marker[r]] < 0) first[marker[r]] = r;
    ++count[marker[r]];
  }
  const Tensor x = host.to(gpu());
  host = Tensor();
  CHECK(argmax(x, 1).to(kCPU).to_vector<int64_t>() == marker);
  CHECK(amax(x, {1}).to(kCPU).to_vector<int64_t>() == std::vector<int64_t>(rows, 9));
  CHECK(sum(x, {1}).to(kCPU).to_vector<int64_t>() == std::vector<int64_t>(rows, 9));
  std::vector<int64_t> column_sums(cols);
  for (int64_t c = 0; c < cols; ++c) column_sums[c] = 9 * count[c];  // at most 18: no uint8 wrap
  CHECK(argmax(x, 0).to(kCPU).to_vector<int64_t>() == first);
  CHECK(sum(x, {0}).to(kCPU).to_vector<int64_t>() == column_sums);
  std::vector<int64_t> first_zero(cols, 0);  // row 0, but for the columns of the first markers
  for (int64_t c = 0; c < cols; ++c)
    while (marker[first_zero[c]] == c) ++first_zero[c];
  CHECK(argmin(x, 0).to(kCPU).to_vector<int64_t>() == first_zero);
  CHECK(amax(x).item<int64_t>() == 9);
}

TEST_CASE("2^31: index_select, gather, scatter_add and index_add at offsets past 2^31") {
  release_cached();
  // index_ops.cu: index_select_rows writes out + r * inner, gather_elements reads through a
  // StridedIndexer plus at * step, scatter_add_owned and index_add_owned write rows of a
  // [65537, 32769] uint8 tensor beyond element 2^31, all with int64_t offsets.
  {
    constexpr int64_t inner = int64_t{1} << 20, k = 2049;  // out: 2^31 + 2^20 elements
    const Tensor x = byte_pattern(4 * inner, 29, 3).view({4, inner});
    std::vector<int64_t> rows(k);
    for (int64_t j = 0; j < k; ++j) rows[j] = (j * 5 + 3) % 4;
    const Tensor out = index_select(on_gpu(x), 0, on_gpu(tensor(rows)));
    const uint8_t* px = x.data_ptr<uint8_t>();
    CHECK_EMPTY(first_wrong<uint8_t>(out, k, inner, [px, &rows](int64_t r, int64_t c) {
      return px[rows[r] * inner + c];
    }));
  }
  release_cached();
  constexpr int64_t rows = 65537, cols = 32769;
  const Tensor base = byte_pattern(rows + cols - 1, 37, 11);
  const uint8_t* pb = base.data_ptr<uint8_t>();
  Tensor x = on_gpu(base).as_strided({rows, cols}, {1, 1}, 0).contiguous();
  std::vector<int64_t> index(2 * cols);
  std::vector<uint8_t> src(2 * cols);
  for (int64_t c = 0; c < cols; ++c) {
    index[c] = rows - 1 - c % 5;
    index[cols + c] = (c * 7) % rows;
    src[c] = static_cast<uint8_t>(c % 3 + 1);
    src[cols + c] = static_cast<uint8_t>(c % 7 + 1);
  }
  const Tensor gindex = on_gpu(tensor(index, {2, cols}));
  const Tensor gathered = gather(x, 0, gindex);
  CHECK_EMPTY(first_wrong<uint8_t>(gathered, 2, cols, [pb, &index](int64_t i, int64_t c) {
    return pb[index[i * cols + c] + c];
  }));
  {
    const Tensor added = scatter_add(x, 0, gindex, on_gpu(tensor(src, {2, cols})));
    CHECK_EMPTY(first_wrong<uint8_t>(added, rows, cols, [pb, &index, &src](int64_t r, int64_t c) {
      uint8_t v = pb[r + c];
      if (index[c] == r) v = static_cast<uint8_t>(v + src[c]);
      if (index[cols + c] == r) v = static_cast<uint8_t>(v + src[cols + c]);
      return v;
    }));
  }
  // index_add into x as [outer 1, n 65537, inner 32769]: rows 65536 (twice, in index order) and 5.
  const Tensor add_src = byte_pattern(3 * cols, 3, 1).view({1, 3, cols});
  index_add_stub(gpu(), on_gpu(add_src), on_gpu(tensor(std::vector<int64_t>{rows - 1, 5, rows - 1})), x, 1, rows,
                 cols, -1);
  const uint8_t* ps = add_src.data_ptr<uint8_t>();
  CHECK_EMPTY(first_wrong<uint8_t>(x.select(0, rows - 1), 1, cols, [pb, ps](int64_t, int64_t c) {
    return static_cast<uint8_t>(pb[rows - 1 + c] + ps[c] + ps[2 * cols + c]);
  }));
  CHECK_EMPTY(first_wrong<uint8_t>(x.select(0, 5), 1, cols, [pb, ps](int64_t, int64_t c) {
    return static_cast<uint8_t>(pb[5 + c] + ps[cols + c]);
  }));
  CHECK_EMPTY(first_wrong<uint8_t>(x.select(0, rows - 2), 1, cols, [pb](int64_t, int64_t c) {
    return pb[rows - 2 + c];
  }));
}

TEST_CASE("2^31: max_pool2d indices past 2^31 in a plane of a stride-0 view") {
  release_cached();
  // pooling_kernels.cu launch_max_pool: best_at = h * width + w in int64_t. The plane is
  // 65537 x 32769 (2^31 + 98305 positions) of a Hankel view over 98305 floats; a 2 x 2 window
  // dilated (65536, 32768) taps its corners, and the largest is the last: index
  // 65536 * 32769 + 32768 = 2147581952.
  const int64_t h = 65537, w = 32769;
  Tensor base = test::random({h + w - 1}, DType::Float32, 80);
  fill_(base.slice(0, h + w - 2, h + w - 1), 100.0);
  const Tensor x = base.as_strided({1, 1, h, w}, {0, 0, 1, 1}, 0);
  const Tensor gx = on_gpu(base).as_strided({1, 1, h, w}, {0, 0, 1, 1}, 0);
  const std::pair<Tensor, Tensor> dev = max_pool2d_with_indices(gx, {2, 2}, {1, 1}, {0, 0}, {h - 1, w - 1});
  const std::pair<Tensor, Tensor> host = max_pool2d_with_indices(x, {2, 2}, {1, 1}, {0, 0}, {h - 1, w - 1});
  CHECK_IDENTICAL(dev.first, host.first);
  CHECK_IDENTICAL(dev.second, host.second);
  CHECK(dev.second.item<int64_t>() == (h - 1) * w + (w - 1));
  CHECK(dev.first.item<float>() == 100.0f);
}

TEST_CASE("2^31: a random fill of more than 2^31 bytes equals the CPU's at the same Philox blocks") {
  release_cached();
  // random.cu random_kernel: element i of a uint8 integer fill takes words 2i, 2i + 1 of the
  // stream, i.e. Philox block first + i / 2; int64_t indices beyond 2^31. Spot-checked at
  // the start, across 2^31 and at the end against CPU fills starting at the same block.
  const int64_t n = (int64_t{1} << 31) + 3000;
  const uint64_t seed = 90, first = 12345;
  Tensor dev = empty({n}, TensorOptions(DType::UInt8, gpu()));
  random_stub(gpu(), dev, RandomKind::Integer, 0, 256, seed, first);
  for (int64_t start : {int64_t{0}, (int64_t{1} << 31) - 1000, n - 1006}) {
    CAPTURE(start);
    Tensor expected = empty({1006}, DType::UInt8);
    random_stub(kCPU, expected, RandomKind::Integer, 0, 256, seed, first + static_cast<uint64_t>(start / 2));
    CHECK_IDENTICAL(dev.slice(0, start, start + 1006), expected);
  }
}

TEST_CASE("mse_loss: 65537 segments of 64 KiB past kMaxGrid, 2^30 elements, run with the 2^31 cases") {
  release_cached();
  // loss.cu mse_loss_kernel: squared_error_partial_kernel runs grid_for(segments) <= kMaxGrid =
  // 65536 blocks of one kSegmentBytes = 64 KiB segment each; 65537 segments of 16384 floats
  // make the grid loop. input and target overlap in one buffer of 0, 1, 0, 1, ... (target is
  // input shifted by one), so every squared difference is 1: the sum is n, the mean 1. 4 GiB.
  const int64_t n = (kMaxGrid + 1) * 16384;
  const Tensor pairs = full({1, 2}, 0.0, TensorOptions(DType::Float32, gpu()));
  fill_(pairs.select(1, 1), 1.0);
  const Tensor buffer = pairs.expand({n / 2 + 1, 2}).contiguous().view({n + 2});
  const Tensor input = buffer.slice(0, 0, n), target = buffer.slice(0, 1, n + 1);
  CHECK(mse_loss(input, target, Reduction::Sum).item() == static_cast<double>(n));
  CHECK(mse_loss(input, target, Reduction::Mean).item() == 1.0);
}
