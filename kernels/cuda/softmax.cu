// CUDA softmax / log_softmax, forward and backward (contract: kernels/softmax_kernels.h;
// reference semantics: kernels/cpu/softmax.cpp).
//
// Every position (the n values of one row, or of one column at stride post) is one
// reduction followed by one elementwise write, both by the same threads:
//   forward   a one-pass online softmax (kernels/cuda/online_softmax.cuh): each lane
//             keeps the largest value it has seen and the float64 sum of exp(x - that
//             maximum); lanes merge their pairs the same way. The input is read twice
//             (the pass and the write) instead of three times (max, sum, write).
//   backward  the float64 sum of grad * out (softmax) or of grad (log_softmax).
// Rows (post == 1) go to 4 or 32 lanes of a warp, or to a whole block when long;
// columns (post > 1) go to tiles whose warps read adjacent positions (coalesced) and
// whose tile rows split n. Each position's reduction has a fixed shape (Note [Fixed
// reduction trees] in kernels/cuda/group_reduce.cuh): results are bitwise reproducible.
//
// As on the CPU, exp is taken in the input's precision and sums in float64, and a NaN
// anywhere in a position makes all of it NaN, as does a +inf or a position of only -inf
// (kernels/cuda/online_softmax.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/group_reduce.cuh"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/online_softmax.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/softmax_kernels.h"

namespace weft::cuda {

namespace {

constexpr int kLogThreads = 8;
constexpr int kThreads = 1 << kLogThreads;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int64_t kMaxGrid = 1 << 16;  // grid-stride loops beyond (results do not depend on the grid)

int grid_for(int64_t blocks) { return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxGrid)); }

// --- the four passes --------------------------------------------------------------------
// A pass reduces a State over a position's elements (add(state, flat offset)), turns the
// total into a Final, and writes every element of the position from it.

template <class T, bool kLog>
struct ForwardPass {
  using State = RunningSoftmax<T>;
  struct Final {
    T max;
    double scale;  // softmax: 1 / sum; log_softmax: log(sum)
  };
  const T* __restrict__ x;
  T* __restrict__ y;
  __device__ State identity() const { return running_identity<T>(); }
  __device__ State add(State s, int64_t at) const { return running_add(s, x[at]); }
  __device__ State combine(State a, State b) const { return running_combine(a, b); }
  __device__ Final finish(State s) const {
    const double sum = running_sum(s);
    return {s.max, kLog ? ::log(sum) : 1.0 / sum};
  }
  __device__ void write(const Final& f, int64_t at) const {
    const T shifted = x[at] - f.max;
    if constexpr (kLog) y[at] = static_cast<T>(static_cast<double>(shifted) - f.scale);
    else y[at] = static_cast<T>(static_cast<double>(exp_in(shifted)) * f.scale);
  }
};

template <class T, bool kLog>
struct BackwardPass {
  using State = double;  // sum of grad (log_softmax) or of grad * out (softmax)
  using Final = double;
  const T* __restrict__ grad;
  const T* __restrict__ out;
  T* __restrict__ grad_in;
  __device__ State identity() const { return 0.0; }
  __device__ State add(State s, int64_t at) const {
    return s + (kLog ? static_cast<double>(grad[at]) : static_cast<double>(grad[at]) * static_cast<double>(out[at]));
  }
  __device__ State combine(State a, State b) const { return a + b; }
  __device__ Final finish(State s) const { return s; }
  __device__ void write(Final sum, int64_t at) const {
    if constexpr (kLog) {
      grad_in[at] = static_cast<T>(static_cast<double>(grad[at]) - static_cast<double>(exp_in(out[at])) * sum);
    } else {
      grad_in[at] = static_cast<T>(static_cast<double>(out[at]) * (static_cast<double>(grad[at]) - sum));
    }
  }
};

// --- kernels -----------------------------------------------------------------------------

// Rows of n contiguous elements: G lanes (G <= 32) or the whole block (G == kThreads) per
// row; lane l takes elements l, l + G, ... (a warp reads adjacent addresses).
template <class P, int G>
__global__ void __launch_bounds__(kThreads) rows_kernel(P p, int64_t outer, int64_t n) {
  using S = typename P::State;
  constexpr int kGroups = kThreads / G;
  __shared__ S scratch[kWarps + 1];
  const int lane = threadIdx.x % G;
  auto combine = [&p](S a, S b) { return p.combine(a, b); };
  // `base` is the same for the whole block: every thread reaches the shuffles and barriers.
  for (int64_t base = blockIdx.x * int64_t{kGroups}; base < outer; base += gridDim.x * int64_t{kGroups}) {
    const int64_t row = base + threadIdx.x / G;
    const bool active = row < outer;
    const int64_t first = row * n;
    S s = p.identity();
    if (active) {
#pragma unroll 4
      for (int64_t i = lane; i < n; i += G) s = p.add(s, first + i);
    }
    s = lanes_allreduce<G, kThreads>(s, p.identity(), combine, scratch);
    if (active) {
      const typename P::Final f = p.finish(s);
      for (int64_t i = lane; i < n; i += G) p.write(f, first + i);
    }
  }
}

// Columns: tiles of 2^log_bx adjacent positions of one outer index; tile row y takes the
// elements y, y + by, ... of its column.
template <class P>
__global__ void __launch_bounds__(kThreads) columns_kernel(P p, int64_t outer, int64_t n, int64_t post, int log_bx) {
  using S = typename P::State;
  __shared__ S smem[kThreads];
  const int bx = 1 << log_bx, by = kThreads >> log_bx;
  const int x = threadIdx.x & (bx - 1), y = threadIdx.x >> log_bx;
  const int64_t tiles = (post + bx - 1) / bx;
  const int64_t step = int64_t{by} * post;
  auto combine = [&p](S a, S b) { return p.combine(a, b); };
  for (int64_t unit = blockIdx.x; unit < outer * tiles; unit += gridDim.x) {
    const int64_t o = unit / tiles, column = (unit % tiles) * bx + x;
    const bool active = column < post;
    const int64_t first = o * n * post + column + y * post;
    S s = p.identity();
    if (active) {
#pragma unroll 4
      for (int64_t i = y, at = first; i < n; i += by, at += step) s = p.add(s, at);
    }
    s = tile_column_allreduce<kThreads>(s, log_bx, combine, smem);
    if (active) {
      const typename P::Final f = p.finish(s);
      for (int64_t i = y, at = first; i < n; i += by, at += step) p.write(f, at);
    }
  }
}

// `op` names the op in a launch failure.
template <class P>
void launch(const char* op, const P& p, int64_t outer, int64_t n, int64_t post, cudaStream_t stream) {
  if (post > 1) {
    const int log_bx = tile_log_width(post, n, kLogThreads);
    const int64_t tiles = outer * ((post + (int64_t{1} << log_bx) - 1) >> log_bx);
    columns_kernel<P><<<grid_for(tiles), kThreads, 0, stream>>>(p, outer, n, post, log_bx);
  } else if (n <= 16) {
    rows_kernel<P, 4><<<grid_for((outer + kThreads / 4 - 1) / (kThreads / 4)), kThreads, 0, stream>>>(p, outer, n);
  } else if (n <= 1024) {
    rows_kernel<P, kWarpSize><<<grid_for((outer + kWarps - 1) / kWarps), kThreads, 0, stream>>>(p, outer, n);
  } else {
    rows_kernel<P, kThreads><<<grid_for(outer), kThreads, 0, stream>>>(p, outer, n);
  }
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
}

void softmax_kernel(const Tensor& in, const Tensor& out, int64_t outer, int64_t n, int64_t post, bool log) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  dispatch_floating(in.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.raw_data());
    T* y = static_cast<T*>(out.raw_data());
    if (log) launch("log_softmax", ForwardPass<T, true>{x, y}, outer, n, post, stream);
    else launch("softmax", ForwardPass<T, false>{x, y}, outer, n, post, stream);
  });
}

void softmax_backward_kernel(const Tensor& grad, const Tensor& out, const Tensor& grad_in, int64_t outer, int64_t n,
                             int64_t post, bool log) {
  DeviceGuard guard(grad_in.device());
  cudaStream_t stream = stream_of(grad_in.device());
  dispatch_floating(out.dtype(), "softmax backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = static_cast<const T*>(grad.raw_data());
    const T* y = static_cast<const T*>(out.raw_data());
    T* gx = static_cast<T*>(grad_in.raw_data());
    if (log) launch("log_softmax_backward", BackwardPass<T, true>{g, y, gx}, outer, n, post, stream);
    else launch("softmax_backward", BackwardPass<T, false>{g, y, gx}, outer, n, post, stream);
  });
}

}  // namespace

void register_softmax_kernels() {
  softmax_stub.set(DeviceType::CUDA, &softmax_kernel);
  softmax_backward_stub.set(DeviceType::CUDA, &softmax_backward_kernel);
}

}  // namespace weft::cuda
