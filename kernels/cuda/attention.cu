// CUDA fused attention: FlashAttention's forward and an atomic-free backward (contract:
// kernels/attention_kernels.h; reference semantics: kernels/cpu/attention.cpp).
//
// Every kernel works on tiles of kRows = 32 queries by kCols = 32 keys with 128 threads:
// thread t owns row t / 4 of the tile of scores and 8 of its 32 columns, so a row's four
// threads are adjacent lanes and meet through two xor-shuffles. Head dims are read in chunks
// of D columns (64 in float32, 32 in float64, so that each kernel's tiles fit the default
// 48 KiB of shared memory): a score is summed over E chunk by chunk, and an output row
// (of out, grad_q, grad_k, grad_v) is split into D-column chunks, one block per chunk
// (grid.y). For head dims up to D every product is one chunk and a tile that does not
// change is loaded once; longer ones repeat the score products per output chunk, which is
// correct for any E and Ev.
//
//   forward    a block per (bh, query tile, chunk of out's columns) walks the key tiles:
//              scores from shared tiles of q and k, then the online softmax (running max m
//              and sum l per row; when m grows, l and the accumulator are rescaled by
//              exp(m_old - m_new)), then P v into registers. Writes out and lse = m + log l.
//   backward   D = rowsum(grad_out * out) (a warp per row), then two kernels that each own
//              their outputs: a block per (bh, key tile, column chunk) sums grad_k and grad_v
//              over the query tiles; a block per (bh, query tile, column chunk) sums grad_q
//              over the key tiles. Both recompute P = exp(x - lse) from q and k.
// Causal tiles past the diagonal are skipped (tiles are square, so every tile that is walked
// has a visible key in each row). No atomics, and every sum runs in an order fixed by the
// shapes: results repeat bit for bit. Products and accumulators are in the input's dtype, l
// and D in float64, exp in the input's precision, as on the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/attention_kernels.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/online_softmax.cuh"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

// --- kernels -----------------------------------------------------------------------------

constexpr int kThreads = 128;
constexpr int kRows = 32;  // queries per tile
constexpr int kCols = 32;  // keys per tile
constexpr int kLanesPerRow = kThreads / kRows;
constexpr int kColsPerLane = kCols / kLanesPerRow;
constexpr int kWarp = 32;
constexpr unsigned kAllLanes = 0xffffffffu;
// The backward kernels' accumulators give the thread of row r the key r: tiles are square.
static_assert(kRows == kCols && kRows * kLanesPerRow == kThreads && kColsPerLane * kLanesPerRow == kCols);

// Head-dim columns per shared tile.
template <class T>
struct Chunk;
template <>
struct Chunk<float> {
  static constexpr int value = 64;
};
template <>
struct Chunk<double> {
  static constexpr int value = 32;
};

// Rows are padded by one element so that the 8 rows a warp reads at once fall in different banks.
template <class T, int D>
struct ForwardTiles {
  T q[kRows][D + 1];
  T k[kCols][D + 1];
  T v[kCols][D + 1];
  T p[kRows][kCols + 1];
};

template <class T, int D>
struct BackwardTiles {
  T q[kRows][D + 1];
  T k[kCols][D + 1];
  T v[kCols][D + 1];
  T g[kRows][D + 1];      // grad_out
  T x[kRows][kCols + 1];  // P, then dS
};

// dst[r][c] = src[r * ld + c] for r < rows_valid and c < cols_valid, else 0, for the R x D
// tile; consecutive threads read consecutive columns.
template <class T, int R, int D>
__device__ __forceinline__ void load_tile(T (*dst)[D + 1], const T* __restrict__ src, int64_t ld, int rows_valid,
                                          int cols_valid) {
  for (int idx = threadIdx.x; idx < R * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    dst[r][c] = r < rows_valid && c < cols_valid ? src[r * ld + c] : T(0);
  }
}

// s[n] += sum_{d < depth} a[r][d] * b[c0 + n][d]: one chunk of the thread's 8 dot products.
template <class T, int D>
__device__ __forceinline__ void accumulate_scores(T (&s)[kColsPerLane], const T (*a)[D + 1], const T (*b)[D + 1],
                                                  int r, int c0, int depth) {
  for (int d = 0; d < depth; ++d) {
    const T x = a[r][d];
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) s[n] += x * b[c0 + n][d];
  }
}

// Max / sum over the kLanesPerRow adjacent lanes of a row (every lane gets the result).
// Both partners of a butterfly step add the same two values, so the sums agree bit for bit.
template <class T>
__device__ __forceinline__ T lanes_max(T x) {
#pragma unroll
  for (int mask = 1; mask < kLanesPerRow; mask *= 2) {
    const T y = __shfl_xor_sync(kAllLanes, x, mask);
    x = y > x ? y : x;
  }
  return x;
}

template <class T>
__device__ __forceinline__ T lanes_sum(T x) {
#pragma unroll
  for (int mask = 1; mask < kLanesPerRow; mask *= 2) x += __shfl_xor_sync(kAllLanes, x, mask);
  return x;
}

// The index of a causal run's first tiles: 0 .. tiles - 1 with the most work first.
__device__ __forceinline__ int64_t tile_of_block(int64_t tiles) { return tiles - 1 - blockIdx.x % tiles; }

// Key tiles that the query tile starting at i0 (rows_valid rows) sees.
__device__ __forceinline__ int64_t key_tiles_for(int64_t i0, int rows_valid, int64_t S, bool causal) {
  const int64_t all = (S + kCols - 1) / kCols;
  return causal ? std::min(all, (i0 + rows_valid - 1) / kCols + 1) : all;
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             T* __restrict__ out, T* __restrict__ lse, int64_t L, int64_t S, int E, int Ev, T scale,
                             bool causal, int64_t q_tiles) {
  __shared__ ForwardTiles<T, D> sm;
  constexpr int kAcc = D / kLanesPerRow;
  const T minus_inf = -std::numeric_limits<T>::infinity();
  const int64_t b = blockIdx.x / q_tiles, i0 = tile_of_block(q_tiles) * kRows;
  const int col0 = blockIdx.y * D, out_cols = std::min(D, Ev - col0);
  const int r = threadIdx.x / kLanesPerRow, lane = threadIdx.x % kLanesPerRow, c0 = lane * kColsPerLane;
  const int64_t i = i0 + r;
  const int rows_valid = static_cast<int>(std::min<int64_t>(kRows, L - i0));
  const T* qb = q + (b * L + i0) * E;
  const T* kb = k + b * S * E;
  const T* vb = v + b * S * Ev + col0;

  T acc[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) acc[a] = T(0);
  T m = minus_inf;
  double l = 0;
  const bool q_resident = E <= D;
  if (q_resident) load_tile<T, kRows, D>(sm.q, qb, E, rows_valid, E);
  const int64_t tiles = key_tiles_for(i0, rows_valid, S, causal);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t j0 = t * kCols;
    const int keys_valid = static_cast<int>(std::min<int64_t>(kCols, S - j0));
    T s[kColsPerLane];
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) s[n] = T(0);
    for (int e0 = 0; e0 < E; e0 += D) {
      __syncthreads();  // the previous readers of the tiles are done
      if (!q_resident) load_tile<T, kRows, D>(sm.q, qb + e0, E, rows_valid, E - e0);
      load_tile<T, kCols, D>(sm.k, kb + j0 * E + e0, E, keys_valid, E - e0);
      if (e0 == 0) load_tile<T, kCols, D>(sm.v, vb + j0 * Ev, Ev, keys_valid, out_cols);
      __syncthreads();
      accumulate_scores<T, D>(s, sm.q, sm.k, r, c0, std::min(D, E - e0));
    }
    // The online softmax step of row r: its four lanes agree on m, alpha and l.
    T tile_max = minus_inf;
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) {
      const int64_t j = j0 + c0 + n;
      s[n] = j < S && (!causal || j <= i) ? s[n] * scale : minus_inf;
      tile_max = s[n] > tile_max ? s[n] : tile_max;
    }
    tile_max = lanes_max(tile_max);
    const T m_new = tile_max > m ? tile_max : m;
    // Equal maxima (the first tile of a row whose scores are all -inf too) rescale by 1,
    // never by exp(-inf + inf).
    const T alpha = m == m_new ? T(1) : exp_in(static_cast<T>(m - m_new));
    T tile_sum = 0;
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) {
      const int64_t j = j0 + c0 + n;
      const T p = j < S && (!causal || j <= i) ? exp_in(static_cast<T>(s[n] - m_new)) : T(0);
      sm.p[r][c0 + n] = p;
      tile_sum += p;
    }
    tile_sum = lanes_sum(tile_sum);
    l = l * static_cast<double>(alpha) + static_cast<double>(tile_sum);
    m = m_new;
#pragma unroll
    for (int a = 0; a < kAcc; ++a) acc[a] *= alpha;
    __syncthreads();  // P and v complete
    for (int j = 0; j < keys_valid; ++j) {
      const T p = sm.p[r][j];
#pragma unroll
      for (int a = 0; a < kAcc; ++a) acc[a] += p * sm.v[j][lane + kLanesPerRow * a];
    }
  }
  if (i < L) {
    const double inv = 1.0 / l;
    T* o = out + (b * L + i) * Ev + col0;
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int c = lane + kLanesPerRow * a;
      if (c < out_cols) o[c] = static_cast<T>(static_cast<double>(acc[a]) * inv);
    }
    if (blockIdx.y == 0 && lane == 0) lse[b * L + i] = static_cast<T>(static_cast<double>(m) + ::log(l));
  }
}

// delta_i = sum_c grad_out_ic * out_ic in float64: a warp per row, lanes strided, then a
// butterfly (fixed order).
template <class T>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(const T* __restrict__ g, const T* __restrict__ out, T* __restrict__ delta, int64_t rows,
                           int Ev) {
  constexpr int kWarps = kThreads / kWarp;
  const int lane = threadIdx.x % kWarp;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarp; row < rows;
       row += int64_t{gridDim.x} * kWarps) {
    double s = 0;
    for (int c = lane; c < Ev; c += kWarp) {
      s += static_cast<double>(g[row * Ev + c]) * static_cast<double>(out[row * Ev + c]);
    }
#pragma unroll
    for (int mask = 1; mask < kWarp; mask *= 2) s += __shfl_xor_sync(kAllLanes, s, mask);
    if (lane == 0) delta[row] = static_cast<T>(s);
  }
}

// The scores and dO v^T of one tile, into p and ds as P and dS = P * (dO v^T - delta):
// row r of the tile (query i), the thread's 8 keys from j0 + c0. Reads the tiles' chunks,
// loading those that are not resident. On return the last chunks loaded are in sm.q and sm.g.
template <class T, int D>
__device__ __forceinline__ void probabilities_and_ds(BackwardTiles<T, D>& sm, const T* qt, const T* gt, const T* kt,
                                                     const T* vt, int rows_valid, int keys_valid, int E, int Ev,
                                                     bool q_resident, bool k_resident, bool g_resident,
                                                     bool v_resident, int r, int c0, int64_t i, int64_t j0,
                                                     int64_t L, int64_t S, T scale, bool causal, T lse_i, T delta_i,
                                                     T (&p)[kColsPerLane], T (&ds)[kColsPerLane]) {
  T s[kColsPerLane], dp[kColsPerLane];
#pragma unroll
  for (int n = 0; n < kColsPerLane; ++n) s[n] = dp[n] = T(0);
  for (int e0 = 0; e0 < E; e0 += D) {
    __syncthreads();
    if (!q_resident) load_tile<T, kRows, D>(sm.q, qt + e0, E, rows_valid, E - e0);
    if (!k_resident) load_tile<T, kCols, D>(sm.k, kt + e0, E, keys_valid, E - e0);
    __syncthreads();
    accumulate_scores<T, D>(s, sm.q, sm.k, r, c0, std::min(D, E - e0));
  }
  for (int e0 = 0; e0 < Ev; e0 += D) {
    __syncthreads();
    if (!g_resident) load_tile<T, kRows, D>(sm.g, gt + e0, Ev, rows_valid, Ev - e0);
    if (!v_resident) load_tile<T, kCols, D>(sm.v, vt + e0, Ev, keys_valid, Ev - e0);
    __syncthreads();
    accumulate_scores<T, D>(dp, sm.g, sm.v, r, c0, std::min(D, Ev - e0));
  }
#pragma unroll
  for (int n = 0; n < kColsPerLane; ++n) {
    const int64_t j = j0 + c0 + n;
    p[n] = i < L && j < S && (!causal || j <= i) ? exp_in(static_cast<T>(s[n] * scale - lse_i)) : T(0);
    ds[n] = p[n] * (dp[n] - delta_i);
  }
}

// grad_k and grad_v of one key tile and one chunk of columns (of E for grad_k, of Ev for
// grad_v; a chunk past either is skipped for it), summed over the query tiles that see it.
// The thread of score row r accumulates key j0 + r.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_kernel(const T* __restrict__ g, const T* __restrict__ q, const T* __restrict__ k,
                                 const T* __restrict__ v, const T* __restrict__ lse, const T* __restrict__ delta,
                                 T* __restrict__ dk, T* __restrict__ dv, int64_t L, int64_t S, int E, int Ev, T scale,
                                 bool causal, int64_t k_tiles) {
  __shared__ BackwardTiles<T, D> sm;
  constexpr int kAcc = D / kLanesPerRow;
  // Key tile 0 is seen by the most query tiles under causal masking: natural order is heaviest first.
  const int64_t b = blockIdx.x / k_tiles, j0 = (blockIdx.x % k_tiles) * kCols;
  const int chunk = blockIdx.y, col0 = chunk * D;
  const bool has_dk = col0 < E, has_dv = col0 < Ev;
  const int r = threadIdx.x / kLanesPerRow, lane = threadIdx.x % kLanesPerRow, c0 = lane * kColsPerLane;
  const int keys_valid = static_cast<int>(std::min<int64_t>(kCols, S - j0));
  const T* kt = k + (b * S + j0) * E;
  const T* vt = v + (b * S + j0) * Ev;
  const int last_e_chunk = (E - 1) / D, last_ev_chunk = (Ev - 1) / D;
  const bool k_resident = E <= D, v_resident = Ev <= D;
  if (k_resident) load_tile<T, kCols, D>(sm.k, kt, E, keys_valid, E);
  if (v_resident) load_tile<T, kCols, D>(sm.v, vt, Ev, keys_valid, Ev);

  T dk_acc[kAcc], dv_acc[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) dk_acc[a] = dv_acc[a] = T(0);
  const int64_t q_tiles = (L + kRows - 1) / kRows;
  // Causal: query tiles whose rows all precede j0 see none of these keys.
  for (int64_t t = causal ? j0 / kRows : 0; t < q_tiles; ++t) {
    const int64_t i0 = t * kRows, i = i0 + r;
    const int rows_valid = static_cast<int>(std::min<int64_t>(kRows, L - i0));
    const T* qt = q + (b * L + i0) * E;
    const T* gt = g + (b * L + i0) * Ev;
    const T lse_i = i < L ? lse[b * L + i] : T(0), delta_i = i < L ? delta[b * L + i] : T(0);
    T p[kColsPerLane], ds[kColsPerLane];
    probabilities_and_ds<T, D>(sm, qt, gt, kt, vt, rows_valid, keys_valid, E, Ev, false, k_resident, false,
                               v_resident, r, c0, i, j0, L, S, scale, causal, lse_i, delta_i, p, ds);
    __syncthreads();  // the products above are done with every tile
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) sm.x[r][c0 + n] = p[n];
    if (has_dv && chunk != last_ev_chunk) load_tile<T, kRows, D>(sm.g, gt + col0, Ev, rows_valid, Ev - col0);
    if (has_dk && chunk != last_e_chunk) load_tile<T, kRows, D>(sm.q, qt + col0, E, rows_valid, E - col0);
    __syncthreads();
    if (has_dv) {
      for (int row = 0; row < rows_valid; ++row) {
        const T pr = sm.x[row][r];
#pragma unroll
        for (int a = 0; a < kAcc; ++a) dv_acc[a] += pr * sm.g[row][lane + kLanesPerRow * a];
      }
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) sm.x[r][c0 + n] = ds[n];
    __syncthreads();
    if (has_dk) {
      for (int row = 0; row < rows_valid; ++row) {
        const T d = sm.x[row][r];
#pragma unroll
        for (int a = 0; a < kAcc; ++a) dk_acc[a] += d * sm.q[row][lane + kLanesPerRow * a];
      }
    }
  }
  if (r < keys_valid) {
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int c = col0 + lane + kLanesPerRow * a;
      if (has_dv && c < Ev) dv[(b * S + j0 + r) * Ev + c] = dv_acc[a];
      if (has_dk && c < E) dk[(b * S + j0 + r) * E + c] = dk_acc[a] * scale;
    }
  }
}

// grad_q of one query tile and one chunk of E's columns, summed over the key tiles it sees.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_kernel(const T* __restrict__ g, const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, const T* __restrict__ lse, const T* __restrict__ delta,
                                T* __restrict__ dq, int64_t L, int64_t S, int E, int Ev, T scale, bool causal,
                                int64_t q_tiles) {
  __shared__ BackwardTiles<T, D> sm;
  constexpr int kAcc = D / kLanesPerRow;
  const int64_t b = blockIdx.x / q_tiles, i0 = tile_of_block(q_tiles) * kRows;
  const int chunk = blockIdx.y, col0 = chunk * D;
  const int r = threadIdx.x / kLanesPerRow, lane = threadIdx.x % kLanesPerRow, c0 = lane * kColsPerLane;
  const int64_t i = i0 + r;
  const int rows_valid = static_cast<int>(std::min<int64_t>(kRows, L - i0));
  const T* qt = q + (b * L + i0) * E;
  const T* gt = g + (b * L + i0) * Ev;
  const bool q_resident = E <= D, g_resident = Ev <= D;
  if (q_resident) load_tile<T, kRows, D>(sm.q, qt, E, rows_valid, E);
  if (g_resident) load_tile<T, kRows, D>(sm.g, gt, Ev, rows_valid, Ev);
  const T lse_i = i < L ? lse[b * L + i] : T(0), delta_i = i < L ? delta[b * L + i] : T(0);
  const int last_e_chunk = (E - 1) / D;

  T dq_acc[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) dq_acc[a] = T(0);
  const int64_t tiles = key_tiles_for(i0, rows_valid, S, causal);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t j0 = t * kCols;
    const int keys_valid = static_cast<int>(std::min<int64_t>(kCols, S - j0));
    const T* kt = k + (b * S + j0) * E;
    const T* vt = v + (b * S + j0) * Ev;
    T p[kColsPerLane], ds[kColsPerLane];
    probabilities_and_ds<T, D>(sm, qt, gt, kt, vt, rows_valid, keys_valid, E, Ev, q_resident, false, g_resident,
                               false, r, c0, i, j0, L, S, scale, causal, lse_i, delta_i, p, ds);
    __syncthreads();  // the products above are done with every tile
#pragma unroll
    for (int n = 0; n < kColsPerLane; ++n) sm.x[r][c0 + n] = ds[n];
    if (chunk != last_e_chunk) load_tile<T, kCols, D>(sm.k, kt + col0, E, keys_valid, E - col0);
    __syncthreads();
    for (int j = 0; j < keys_valid; ++j) {
      const T d = sm.x[r][j];
#pragma unroll
      for (int a = 0; a < kAcc; ++a) dq_acc[a] += d * sm.k[j][lane + kLanesPerRow * a];
    }
  }
  if (i < L) {
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int c = col0 + lane + kLanesPerRow * a;
      if (c < E) dq[(b * L + i) * E + c] = dq_acc[a] * scale;
    }
  }
}

// --- launches ----------------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The grid of a kernel with `tiles` tiles per batch entry and `chunks` column chunks.
dim3 grid_of(int64_t bh, int64_t tiles, int64_t chunks, const char* op) {
  WEFT_CHECK(bh * tiles <= std::numeric_limits<int32_t>::max() && chunks <= 65535, op, ": ", bh,
             " batch entries of ", tiles, " tiles and ", chunks, " column chunks exceed the CUDA grid");
  return dim3(static_cast<unsigned>(bh * tiles), static_cast<unsigned>(chunks));
}

struct Sizes {
  int64_t bh, L, S;
  int E, Ev;
};

Sizes sizes_of(const Tensor& q, const Tensor& v, const char* op) {
  WEFT_CHECK(q.size(2) <= std::numeric_limits<int32_t>::max() && v.size(2) <= std::numeric_limits<int32_t>::max(),
             op, ": head dims ", q.size(2), " and ", v.size(2), " exceed the CUDA kernel's int range");
  return {q.size(0), q.size(1), v.size(1), static_cast<int>(q.size(2)), static_cast<int>(v.size(2))};
}

void forward_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    double scale, bool is_causal) {
  constexpr const char* kOp = "scaled_dot_product_attention";
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  const Sizes z = sizes_of(q, v, kOp);
  dispatch_floating(q.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int D = Chunk<T>::value;
    const int64_t q_tiles = ceil_div(z.L, kRows);
    attention_forward_kernel<T, D><<<grid_of(z.bh, q_tiles, ceil_div(z.Ev, D), kOp), kThreads, 0, stream>>>(
        q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(), lse.data_ptr<T>(), z.L, z.S, z.E, z.Ev,
        static_cast<T>(scale), is_causal, q_tiles);
    WEFT_CUDA_CHECK_LAUNCH(kOp, stream);
  });
}

void backward_kernel(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, const Tensor& delta, const Tensor& grad_q, const Tensor& grad_k,
                     const Tensor& grad_v, double scale, bool is_causal) {
  constexpr const char* kOp = "scaled_dot_product_attention_backward";
  DeviceGuard guard(grad_q.device());
  cudaStream_t stream = stream_of(grad_q.device());
  const Sizes z = sizes_of(q, v, kOp);
  dispatch_floating(q.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int D = Chunk<T>::value;
    const T* g = grad_out.data_ptr<T>();
    const int64_t rows = z.bh * z.L;
    const int64_t delta_blocks = std::min<int64_t>(ceil_div(rows, kThreads / kWarp), int64_t{1} << 16);
    attention_delta_kernel<T><<<static_cast<unsigned>(delta_blocks), kThreads, 0, stream>>>(
        g, out.data_ptr<T>(), delta.data_ptr<T>(), rows, z.Ev);
    WEFT_CUDA_CHECK_LAUNCH(kOp, stream);
    const int64_t k_tiles = ceil_div(z.S, kCols);
    const int64_t kv_chunks = ceil_div(std::max(z.E, z.Ev), D);
    attention_backward_kv_kernel<T, D><<<grid_of(z.bh, k_tiles, kv_chunks, kOp), kThreads, 0, stream>>>(
        g, q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), lse.data_ptr<T>(), delta.data_ptr<T>(),
        grad_k.data_ptr<T>(), grad_v.data_ptr<T>(), z.L, z.S, z.E, z.Ev, static_cast<T>(scale), is_causal, k_tiles);
    WEFT_CUDA_CHECK_LAUNCH(kOp, stream);
    const int64_t q_tiles = ceil_div(z.L, kRows);
    attention_backward_q_kernel<T, D><<<grid_of(z.bh, q_tiles, ceil_div(z.E, D), kOp), kThreads, 0, stream>>>(
        g, q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), lse.data_ptr<T>(), delta.data_ptr<T>(),
        grad_q.data_ptr<T>(), z.L, z.S, z.E, z.Ev, static_cast<T>(scale), is_causal, q_tiles);
    WEFT_CUDA_CHECK_LAUNCH(kOp, stream);
  });
}

}  // namespace

void register_attention_kernels() {
  attention_forward_stub.set(DeviceType::CUDA, &forward_kernel);
  attention_backward_stub.set(DeviceType::CUDA, &backward_kernel);
}

}  // namespace weft::cuda
