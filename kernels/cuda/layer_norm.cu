// CUDA layer normalisation kernels (contract: kernels/layer_norm_kernels.h; reference
// semantics: kernels/cpu/layer_norm.cpp).
//
// Forward and grad_x: each row goes to G lanes, 4 (rows of up to 16 values), a warp (up
// to 1024) or the whole block (longer rows), as in kernels/cuda/softmax.cu; lane l takes
// elements l, l + G, ..., so a warp reads adjacent addresses. The forward reads its row
// three times (the sum, the squares about the mean, the write) and grad_x twice (the two
// sums, the write); after the first pass the row comes from L1 / L2. Sums are float64 and
// reduced in fixed trees (Note [Fixed reduction trees] in kernels/cuda/group_reduce.cuh).
//
// grad_weight and grad_bias are column sums over every row, in two deterministic steps and
// without atomics: a block takes a tile of up to 32 adjacent columns by one chunk of rows
// and reduces each column over its rows in a fixed tree into float64 partials
// [2, chunks, n]; then one thread per column adds its chunks' partials in chunk order. The
// tiles and chunks depend only on the shape (not on the GPU), so the results are the same
// bits on every run and every GPU. Everything after the sums is kernels/layer_norm_math.h,
// shared with the CPU, so the devices differ only as much as their float64 sums do.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/group_reduce.cuh"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/layer_norm_kernels.h"
#include "kernels/layer_norm_math.h"

namespace weft::cuda {

namespace {

constexpr int kLogThreads = 8;
constexpr int kThreads = 1 << kLogThreads;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int64_t kMaxGrid = 1 << 16;  // grid-stride loops beyond (results do not depend on the grid)

int grid_for(int64_t blocks) { return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxGrid)); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Two float64 sums reduced together: grad_x's sum dy and sum dy * xhat, or a column's
// sum grad_y * xhat and sum grad_y.
struct SumPair {
  double a, b;
};

// Found by argument-dependent lookup from group_reduce.cuh; these overloads hide the
// arithmetic ones inside this namespace, hence the qualified calls.
__device__ __forceinline__ SumPair shfl_down(SumPair v, unsigned delta, int width) {
  return {cuda::shfl_down(v.a, delta, width), cuda::shfl_down(v.b, delta, width)};
}
__device__ __forceinline__ SumPair shfl(SumPair v, int src_lane, int width) {
  return {cuda::shfl(v.a, src_lane, width), cuda::shfl(v.b, src_lane, width)};
}
__device__ __forceinline__ SumPair add_pairs(SumPair x, SumPair y) { return {x.a + y.a, x.b + y.b}; }

// f(lanes) with the lanes per row for rows of n values, as a compile-time constant.
template <class F>
void with_lanes(int64_t n, const F& f) {
  if (n <= 16) f(std::integral_constant<int, 4>{});
  else if (n <= 1024) f(std::integral_constant<int, kWarpSize>{});
  else f(std::integral_constant<int, kThreads>{});
}

// --- rows: forward and grad_x ------------------------------------------------------------

template <class T, int G>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                   T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd, int64_t rows, int64_t n,
                   double eps) {
  constexpr int kGroups = kThreads / G;
  __shared__ double scratch[kWarps + 1];
  const int lane = threadIdx.x % G;
  const double count = static_cast<double>(n);
  auto add = [](double u, double v) { return u + v; };
  // `base` is the same for the whole block: every thread reaches the shuffles and barriers.
  for (int64_t base = blockIdx.x * int64_t{kGroups}; base < rows; base += gridDim.x * int64_t{kGroups}) {
    const int64_t row = base + threadIdx.x / G;
    const bool active = row < rows;
    const T* xr = x + (active ? row : 0) * n;
    double sum = 0;
    if (active)
      for (int64_t i = lane; i < n; i += G) sum += static_cast<double>(xr[i]);
    const double m = lanes_allreduce<G, kThreads>(sum, 0.0, add, scratch) / count;
    double sum_sq = 0;
    if (active)
      for (int64_t i = lane; i < n; i += G) {
        const double d = static_cast<double>(xr[i]) - m;
        sum_sq = hd::mul_add(d, d, sum_sq);
      }
    sum_sq = lanes_allreduce<G, kThreads>(sum_sq, 0.0, add, scratch);
    if (!active) continue;
    const T mt = static_cast<T>(m), rt = static_cast<T>(layer_norm_rstd(sum_sq, count, eps));
    if (lane == 0) mean[row] = mt, rstd[row] = rt;
    T* yr = y + row * n;
    for (int64_t i = lane; i < n; i += G)
      yr[i] = layer_norm_apply<T>(xr[i], mt, rt, weight ? weight[i] : T(1), bias ? bias[i] : T(0));
  }
}

template <class T, int G>
__global__ void __launch_bounds__(kThreads)
    grad_input_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ mean,
                      const T* __restrict__ rstd, const T* __restrict__ weight, T* __restrict__ grad_x, int64_t rows,
                      int64_t n) {
  constexpr int kGroups = kThreads / G;
  __shared__ SumPair scratch[kWarps + 1];
  const int lane = threadIdx.x % G;
  auto combine = [](SumPair u, SumPair v) { return add_pairs(u, v); };
  for (int64_t base = blockIdx.x * int64_t{kGroups}; base < rows; base += gridDim.x * int64_t{kGroups}) {
    const int64_t row = base + threadIdx.x / G;
    const bool active = row < rows;
    const int64_t first = (active ? row : 0) * n;
    const double mu = active ? static_cast<double>(mean[row]) : 0.0;
    const double rs = active ? static_cast<double>(rstd[row]) : 0.0;
    auto dy = [&](int64_t i) {
      const double g = static_cast<double>(grad_y[first + i]);
      return weight ? g * static_cast<double>(weight[i]) : g;
    };
    auto xhat = [&](int64_t i) { return layer_norm_xhat(static_cast<double>(x[first + i]), mu, rs); };
    SumPair s{0.0, 0.0};
    if (active)
      for (int64_t i = lane; i < n; i += G) {
        const double d = dy(i);
        s.a += d;
        s.b = hd::mul_add(d, xhat(i), s.b);
      }
    s = lanes_allreduce<G, kThreads>(s, SumPair{0.0, 0.0}, combine, scratch);
    if (!active) continue;
    const LayerNormInputGrad grad_of(rs, s.a, s.b, static_cast<double>(n));
    for (int64_t i = lane; i < n; i += G) grad_x[first + i] = static_cast<T>(grad_of(dy(i), xhat(i)));
  }
}

// --- columns: grad_weight and grad_bias ----------------------------------------------------

// The tiles and chunks of the column sums, from the shape alone. A tile is 2^log_bx
// adjacent columns (the smallest power of two >= n, up to a warp, so that a warp reads
// adjacent addresses) by kThreads / 2^log_bx tile rows. Each tile row takes at least
// kRowsPerTileRow rows of its chunk, and there are about kTargetBlocks blocks in all when the
// rows allow: enough to fill a GPU, few enough partials for one thread per column to add.
struct ColumnPlan {
  static constexpr int64_t kRowsPerTileRow = 8;
  static constexpr int64_t kTargetBlocks = 1024;
  int log_bx = 0;
  int64_t tiles, chunks, chunk_len;

  ColumnPlan(int64_t rows, int64_t n) {
    while (log_bx < 5 && (int64_t{1} << log_bx) < n) ++log_bx;
    tiles = ceil_div(n, int64_t{1} << log_bx);
    const int64_t tile_rows = kThreads >> log_bx;
    const int64_t by_size = ceil_div(rows, tile_rows * kRowsPerTileRow);
    const int64_t by_blocks = std::max<int64_t>(1, kTargetBlocks / tiles);
    chunk_len = ceil_div(rows, std::max<int64_t>(1, std::min(by_size, by_blocks)));
    chunks = ceil_div(rows, chunk_len);
  }
};

// partials[k * n + c] = sum over chunk k's rows of grad_y * xhat in column c, and
// partials[(chunks + k) * n + c] the sum of grad_y.
template <class T>
__global__ void __launch_bounds__(kThreads)
    column_partials_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ mean,
                           const T* __restrict__ rstd, int64_t rows, int64_t n, ColumnPlan plan,
                           double* __restrict__ partials) {
  __shared__ SumPair smem[kThreads];
  const int log_bx = plan.log_bx;
  const int bx = 1 << log_bx, by = kThreads >> log_bx;
  const int tx = threadIdx.x & (bx - 1), ty = threadIdx.x >> log_bx;
  auto combine = [](SumPair u, SumPair v) { return add_pairs(u, v); };
  // `unit` is the same for the whole block: every thread reaches the barriers.
  for (int64_t unit = blockIdx.x; unit < plan.tiles * plan.chunks; unit += gridDim.x) {
    const int64_t chunk = unit / plan.tiles, column = (unit % plan.tiles) * bx + tx;
    const bool active = column < n;
    const int64_t end = std::min(rows, (chunk + 1) * plan.chunk_len);
    SumPair s{0.0, 0.0};
    if (active)
      for (int64_t r = chunk * plan.chunk_len + ty; r < end; r += by) {
        const double g = static_cast<double>(grad_y[r * n + column]);
        const double xh =
            layer_norm_xhat(static_cast<double>(x[r * n + column]), static_cast<double>(mean[r]), rstd[r]);
        s.a = hd::mul_add(g, xh, s.a);
        s.b += g;
      }
    s = tile_column_allreduce<kThreads>(s, log_bx, combine, smem);
    if (active && ty == 0) {
      partials[chunk * n + column] = s.a;
      partials[(plan.chunks + chunk) * n + column] = s.b;
    }
  }
}

// Named function templates (not generic lambdas) around the device lambdas: nvcc rejects an
// extended __device__ lambda inside a generic lambda.
template <class T>
void column_sums(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                 const Tensor& grad_weight, const Tensor& grad_bias, cudaStream_t stream) {
  const int64_t rows = x.size(0), n = x.size(1);
  const ColumnPlan plan(rows, n);
  Tensor partials = empty({2 * plan.chunks * n}, TensorOptions(DType::Float64, x.device()));
  double* p = partials.data_ptr<double>();
  column_partials_kernel<T><<<grid_for(plan.tiles * plan.chunks), kThreads, 0, stream>>>(
      grad_y.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<T>(), rstd.data_ptr<T>(), rows, n, plan, p);
  WEFT_CUDA_CHECK_LAUNCH("layer_norm_backward", stream);
  T* gw = grad_weight.defined() ? grad_weight.data_ptr<T>() : nullptr;
  T* gb = grad_bias.defined() ? grad_bias.data_ptr<T>() : nullptr;
  const int64_t chunks = plan.chunks;
  for_each_index("layer_norm_backward", n, stream, [=] __device__(int64_t c) {
    double sum_w = 0, sum_b = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      sum_w += p[k * n + c];
      sum_b += p[(chunks + k) * n + c];
    }
    if (gw) gw[c] = static_cast<T>(sum_w);
    if (gb) gb[c] = static_cast<T>(sum_b);
  });
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <class T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd, cudaStream_t stream) {
  const int64_t rows = x.size(0), n = x.size(1);
  with_lanes(n, [&](auto lanes) {
    constexpr int G = decltype(lanes)::value;
    forward_kernel<T, G><<<grid_for(ceil_div(rows, kThreads / G)), kThreads, 0, stream>>>(
        x.data_ptr<T>(), data_or_null<T>(weight), data_or_null<T>(bias), y.data_ptr<T>(), mean.data_ptr<T>(),
        rstd.data_ptr<T>(), rows, n, eps);
  });
  WEFT_CUDA_CHECK_LAUNCH("layer_norm", stream);
}

template <class T>
void backward_typed(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                    cudaStream_t stream) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (grad_x.defined()) {
    with_lanes(n, [&](auto lanes) {
      constexpr int G = decltype(lanes)::value;
      grad_input_kernel<T, G><<<grid_for(ceil_div(rows, kThreads / G)), kThreads, 0, stream>>>(
          grad_y.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<T>(), rstd.data_ptr<T>(), data_or_null<T>(weight),
          grad_x.data_ptr<T>(), rows, n);
    });
    WEFT_CUDA_CHECK_LAUNCH("layer_norm_backward", stream);
  }
  if (grad_weight.defined() || grad_bias.defined())
    column_sums<T>(grad_y, x, mean, rstd, grad_weight, grad_bias, stream);
}

void forward_kernel_entry(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                          const Tensor& mean, const Tensor& rstd) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_of(x.device());
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(x, weight, bias, eps, y, mean, rstd, stream);
  });
}

void backward_kernel_entry(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                           const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                           const Tensor& grad_bias) {
  DeviceGuard guard(x.device());
  cudaStream_t stream = stream_of(x.device());
  dispatch_floating(x.dtype(), "layer_norm backward", [&](auto tag) {
    backward_typed<typename decltype(tag)::type>(grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias,
                                                 stream);
  });
}

}  // namespace

void register_layer_norm_kernels() {
  layer_norm_forward_stub.set(DeviceType::CUDA, &forward_kernel_entry);
  layer_norm_backward_stub.set(DeviceType::CUDA, &backward_kernel_entry);
}

}  // namespace weft::cuda
