// The attention teaching ladder (see attention.cuh for the rungs) and, unless
// WEFT_DEV_NO_MAIN is defined, its driver: a float64 CPU reference, validation of every rung
// and of the cuBLAS reference on awkward sizes, causal and not, then a timing table.
//
//   dev_attention [--batch B] [--heads H] [--seq T] [--head-dim E] [--causal] [--reps R] [--json FILE]
//   (default B=8 H=12 T=1024 E=64, not causal, 20 repetitions)
//
// Why the rungs differ by so much: at T = 1024 the scores of one head are 4 MiB, 64 times
// q, k, v and out together. Rungs 1 and 2 move them through global memory several times,
// which costs more than the two products; rung 3 keeps them in registers and shared memory,
// so its floor is arithmetic (4 L S E flops per head), not bandwidth.
#include "kernels/dev/attention.cuh"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublas.h"  // WEFT_CUDA_CHECK for cublasStatus_t

namespace weft::dev {
namespace {

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `rows_on_grid_y`: the launch puts blocks of 8 queries on grid.y (rungs 1 and 2's products).
void check_shape(const char* name, const AttentionShape& s, bool rows_on_grid_y) {
  WEFT_CHECK(s.bh >= 0 && s.L >= 0 && s.S >= 1 && s.E >= 1, name,
             ": needs bh >= 0, L >= 0, S >= 1 and E >= 1, got bh=", s.bh, " L=", s.L, " S=", s.S, " E=", s.E);
  // Heads go on grid.z (rungs 1 and 2) or grid.y (rung 3), whose limit is 65535 blocks.
  WEFT_CHECK(s.bh <= 65535, name, ": bh=", s.bh, " heads exceed the 65535 blocks of a grid's y and z");
  WEFT_CHECK(!rows_on_grid_y || ceil_div(s.L, 8) <= 65535, name, ": L=", s.L,
             " needs more than 65535 row blocks of 8");
}

// The row of query i is causally masked past key i; without a mask it has all S keys.
__device__ __forceinline__ int row_keys(int i, int S, bool causal) { return causal ? min(S, i + 1) : S; }

// --- 1: naive -----------------------------------------------------------------------------
// Scores: one thread per (head, query i, key j), threadIdx.x along j. A warp reads one row
// of q (a broadcast) and 32 rows of k that are E floats apart, so each of its loads touches
// 32 sectors; L1 keeps them for the next e. Masked scores are computed too; the softmax
// ignores them.
__global__ void scores_naive_kernel(int L, int S, int E, float scale, const float* __restrict__ q,
                                    const float* __restrict__ k, float* __restrict__ scores) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int i = blockIdx.y * blockDim.y + threadIdx.y;
  const int64_t head = blockIdx.z;
  if (i >= L || j >= S) return;
  const float* qi = q + (head * L + i) * E;
  const float* kj = k + (head * S + j) * E;
  float acc = 0.f;
  for (int e = 0; e < E; ++e) acc = fmaf(qi[e], kj[e], acc);
  scores[(head * L + i) * S + j] = acc * scale;
}

// Softmax: one thread per row, three passes (maximum, sum of exponentials, normalise) over
// S floats each. Neighbouring threads read addresses S floats apart: every load of a warp
// is 32 separate sectors, and a row is read three times and written once.
__global__ void softmax_naive_kernel(int64_t rows, int L, int S, bool causal, float* __restrict__ scores) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= rows) return;
  float* p = scores + row * S;
  const int keys = row_keys(static_cast<int>(row % L), S, causal);
  float max = -INFINITY;
  for (int j = 0; j < keys; ++j) max = fmaxf(max, p[j]);
  float sum = 0.f;
  for (int j = 0; j < keys; ++j) sum += expf(p[j] - max);
  const float inv = 1.f / sum;
  for (int j = 0; j < S; ++j) p[j] = j < keys ? expf(p[j] - max) * inv : 0.f;
}

// P v: one thread per (head, query i, component e), threadIdx.x along e: a warp reads one
// float of P (a broadcast) and 32 consecutive floats of a row of v (coalesced) per key.
// Causal rows still walk every key (their masked probabilities are 0).
__global__ void pv_naive_kernel(int L, int S, int E, const float* __restrict__ p, const float* __restrict__ v,
                                float* __restrict__ out) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  const int i = blockIdx.y * blockDim.y + threadIdx.y;
  const int64_t head = blockIdx.z;
  if (i >= L || e >= E) return;
  const float* pi = p + (head * L + i) * S;
  const float* vh = v + head * S * E + e;
  float acc = 0.f;
  for (int j = 0; j < S; ++j) acc = fmaf(pi[j], vh[static_cast<int64_t>(j) * E], acc);
  out[(head * L + i) * E + e] = acc;
}

void launch_scores_naive(const AttentionShape& s, const float* q, const float* k, float* scores,
                         cudaStream_t stream) {
  dim3 block(32, 8);
  dim3 grid(ceil_div(s.S, 32), ceil_div(s.L, 8), s.bh);
  scores_naive_kernel<<<grid, block, 0, stream>>>(s.L, s.S, s.E, s.scale, q, k, scores);
  WEFT_CUDA_CHECK_LAUNCH();
}

void launch_pv_naive(const AttentionShape& s, const float* p, const float* v, float* out, cudaStream_t stream) {
  dim3 block(32, 8);
  dim3 grid(ceil_div(s.E, 32), ceil_div(s.L, 8), s.bh);
  pv_naive_kernel<<<grid, block, 0, stream>>>(s.L, s.S, s.E, p, v, out);
  WEFT_CUDA_CHECK_LAUNCH();
}

// --- 2: fused softmax -----------------------------------------------------------------------
// One warp per row; lane l reads keys l, l + 32, ... (a warp reads 128 consecutive bytes).
// Online softmax: each lane keeps a running maximum m and the sum l of exp(x - m) over the
// values it has seen, rescaling l by exp(m_old - m_new) when the maximum grows, so one
// pass yields both; the lanes' pairs combine with the same rescaling in a shuffle tree.
// A second pass writes P = exp(x - m) / l in place. Rows: read twice, written once.
constexpr int kSoftmaxWarps = 8;

struct RunningMaxSum {
  float max;
  float sum;  // of exp(x - max) over the values seen
};

__device__ __forceinline__ RunningMaxSum combine(RunningMaxSum a, RunningMaxSum b) {
  const float max = fmaxf(a.max, b.max);
  if (max == -INFINITY) return a;  // neither side has seen a value
  return {max, (a.max == -INFINITY ? 0.f : a.sum * expf(a.max - max)) +
                   (b.max == -INFINITY ? 0.f : b.sum * expf(b.max - max))};
}

__global__ void __launch_bounds__(kSoftmaxWarps * 32)
    softmax_fused_kernel(int64_t rows, int L, int S, bool causal, float* __restrict__ scores) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kSoftmaxWarps) + threadIdx.x / 32;
  if (row >= rows) return;  // a whole warp leaves together, so the shuffles below stay full
  float* p = scores + row * S;
  const int keys = row_keys(static_cast<int>(row % L), S, causal);
  RunningMaxSum acc{-INFINITY, 0.f};
  for (int j = lane; j < keys; j += 32) {
    const float x = p[j];
    if (x > acc.max) {
      acc.sum = acc.sum * expf(acc.max - x) + 1.f;  // exp(-inf) = 0 for the first value
      acc.max = x;
    } else {
      acc.sum += expf(x - acc.max);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const RunningMaxSum other{__shfl_xor_sync(0xffffffffu, acc.max, offset),
                              __shfl_xor_sync(0xffffffffu, acc.sum, offset)};
    acc = combine(acc, other);
  }
  const float inv = 1.f / acc.sum;
  for (int j = lane; j < S; j += 32) p[j] = j < keys ? expf(p[j] - acc.max) * inv : 0.f;
}

void launch_softmax_fused(const AttentionShape& s, float* scores, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(s.bh) * s.L;
  softmax_fused_kernel<<<ceil_div(rows, kSoftmaxWarps), kSoftmaxWarps * 32, 0, stream>>>(rows, s.L, s.S, s.causal,
                                                                                          scores);
  WEFT_CUDA_CHECK_LAUNCH();
}

// --- 3: flash ------------------------------------------------------------------------------
// A block of 256 threads owns 64 queries of one head and walks the keys in tiles of 64:
//
//   load K, V tile -> S = Q K^T (64 x 64, 4 x 4 per thread) -> mask -> online softmax update
//   -> P to shared memory -> O += P V (64 x E, 4 x E/16 per thread)
//
// Thread (ty, tx) = (t / 16, t % 16) owns query rows ty + 16 i and key columns tx + 16 j
// (i, j < 4), and output columns tx + 16 j (j < E/16), so the 16 threads that share a row
// are one half-warp: the row's maximum and sum combine with four xor-shuffles. Per row it
// keeps, in registers, the running maximum m, the running sum l of exp(s - m) and the
// output accumulator; when a tile raises m, l and the accumulator are multiplied by
// exp(m_old - m_new), which makes them what they would have been had m been known from the
// start. The output is divided by l once, at the end.
//
// q is multiplied by scale * log2(e) as it is staged, so scores come out in base 2 and every
// exponential is one exp2f (one MUFU.EX2 instruction).
//
// Shared memory, per block: Q and K tiles with rows padded to E + 1 floats (thread tx reads
// row tx of K: with the pad, 16 rows at the same column fall in 16 banks instead of one),
// the V tile (read along a row: no pad needed), and the P tile with rows padded by 16 floats
// (the two half-warps of a warp read two rows; the pad puts them in disjoint banks).
// Out-of-range rows and columns load as zeros, and scores of keys past S or past the
// diagonal are -inf, so edge tiles need no other case.
constexpr int kBr = 64, kBc = 64, kFlashThreads = 256;
constexpr int kPStride = kBc + 16;
constexpr float kLog2e = 1.4426950408889634f;

template <int kE>
struct FlashSmem {
  static constexpr int kQKStride = kE + 1;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kBr * kQKStride;
  static constexpr int kV = kK + kBc * kQKStride;
  static constexpr int kP = kV + kBc * kE;
  static constexpr int kFloats = kP + kBr * kPStride;
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

template <int kE>
__global__ void __launch_bounds__(kFlashThreads)
    attention_flash_kernel(int L, int S, int E, bool causal, float scale_log2, const float* __restrict__ q,
                           const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ out) {
  using Smem = FlashSmem<kE>;
  constexpr int kQKStride = Smem::kQKStride;
  constexpr int kOutCols = kE / 16;
  extern __shared__ float smem[];
  float* Qs = smem + Smem::kQ;
  float* Ks = smem + Smem::kK;
  float* Vs = smem + Smem::kV;
  float* Ps = smem + Smem::kP;

  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  // Causal blocks do work in proportion to their query tile: the last tiles, the longest,
  // take the lowest block indices and start first, so that short ones fill the tail.
  const int tile = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int q0 = tile * kBr;
  const int64_t head = blockIdx.y;
  q += head * L * E;
  k += head * S * E;
  v += head * S * E;
  out += head * L * E;

  // Consecutive threads take consecutive elements of a row: global reads are coalesced.
  for (int idx = t; idx < kBr * kE; idx += kFlashThreads) {
    const int r = idx / kE, e = idx % kE;
    Qs[r * kQKStride + e] = (q0 + r < L && e < E) ? q[static_cast<int64_t>(q0 + r) * E + e] * scale_log2 : 0.f;
  }

  float m[4], l[4], acc[4][kOutCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kOutCols; ++j) acc[i][j] = 0.f;
  }

  // Keys past the tile's last query are masked for all of its rows: causal blocks stop there.
  const int kv_end = causal ? min(S, q0 + kBr) : S;
  for (int c0 = 0; c0 < kv_end; c0 += kBc) {
    for (int idx = t; idx < kBc * kE; idx += kFlashThreads) {
      const int r = idx / kE, e = idx % kE;
      const bool in = c0 + r < S && e < E;
      const int64_t at = static_cast<int64_t>(c0 + r) * E + e;
      Ks[r * kQKStride + e] = in ? k[at] : 0.f;
      Vs[r * kE + e] = in ? v[at] : 0.f;
    }
    __syncthreads();  // also orders the Q tile's stores before the first tile's reads

    float s[4][4] = {};
#pragma unroll 16
    for (int e = 0; e < kE; ++e) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = Qs[(ty + 16 * i) * kQKStride + e];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Ks[(tx + 16 * j) * kQKStride + e];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = fmaf(a[i], b[j], s[i][j]);
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = q0 + ty + 16 * i;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = c0 + tx + 16 * j;
        if (col >= S || (causal && col > row)) s[i][j] = -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
#pragma unroll
      for (int offset = 8; offset > 0; offset /= 2)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      const float m_new = fmaxf(m[i], tile_max);
      // A row whose keys so far are all masked has m_new = -inf; subtracting 0 instead keeps
      // exp2f(-inf - base) = 0 rather than NaN. (Key 0 is never masked, so this only spares
      // rows past L, which are not written.)
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float rescale = exp2f(m[i] - base);
      float tile_sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = exp2f(s[i][j] - base);
        tile_sum += s[i][j];
        Ps[(ty + 16 * i) * kPStride + tx + 16 * j] = s[i][j];
      }
#pragma unroll
      for (int offset = 8; offset > 0; offset /= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
      l[i] = l[i] * rescale + tile_sum;
      m[i] = m_new;
#pragma unroll
      for (int j = 0; j < kOutCols; ++j) acc[i][j] *= rescale;
    }
    __syncthreads();  // P complete

#pragma unroll 16
    for (int c = 0; c < kBc; ++c) {
      float p[4], vv[kOutCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = Ps[(ty + 16 * i) * kPStride + c];
#pragma unroll
      for (int j = 0; j < kOutCols; ++j) vv[j] = Vs[c * kE + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < kOutCols; ++j) acc[i][j] = fmaf(p[i], vv[j], acc[i][j]);
    }
    __syncthreads();  // the next tile overwrites K, V and P
  }

  // A half-warp writes 16 consecutive floats of a row.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = q0 + ty + 16 * i;
    if (row >= L) continue;
    const float inv = 1.f / l[i];
#pragma unroll
    for (int j = 0; j < kOutCols; ++j) {
      const int e = tx + 16 * j;
      if (e < E) out[static_cast<int64_t>(row) * E + e] = acc[i][j] * inv;
    }
  }
}

// The padded head dimension rung 3 compiles for E; 0 when E > 128.
int flash_padded_e(int E) { return E <= 32 ? 32 : E <= 64 ? 64 : E <= 128 ? 128 : 0; }

size_t flash_smem_bytes(int padded_e) {
  switch (padded_e) {
    case 32: return FlashSmem<32>::kBytes;
    case 64: return FlashSmem<64>::kBytes;
    default: return FlashSmem<128>::kBytes;
  }
}

template <int kE>
void launch_flash(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                  cudaStream_t stream) {
  constexpr size_t bytes = FlashSmem<kE>::kBytes;
  // Above 48 KiB a kernel must opt in to dynamic shared memory (per function, per device).
  WEFT_CUDA_CHECK(cudaFuncSetAttribute(attention_flash_kernel<kE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  dim3 grid(ceil_div(s.L, kBr), s.bh);
  attention_flash_kernel<kE><<<grid, kFlashThreads, bytes, stream>>>(s.L, s.S, s.E, s.causal, s.scale * kLog2e, q,
                                                                    k, v, out);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t attention_workspace_floats(const AttentionShape& shape) {
  return static_cast<int64_t>(shape.bh) * shape.L * shape.S;
}

void attention_naive(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                     float* workspace, cudaStream_t stream) {
  check_shape("attention_naive", shape, true);
  if (shape.bh == 0 || shape.L == 0) return;
  launch_scores_naive(shape, q, k, workspace, stream);
  const int64_t rows = static_cast<int64_t>(shape.bh) * shape.L;
  softmax_naive_kernel<<<ceil_div(rows, 256), 256, 0, stream>>>(rows, shape.L, shape.S, shape.causal, workspace);
  WEFT_CUDA_CHECK_LAUNCH();
  launch_pv_naive(shape, workspace, v, out, stream);
}

void attention_fused_softmax(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                             float* workspace, cudaStream_t stream) {
  check_shape("attention_fused_softmax", shape, true);
  if (shape.bh == 0 || shape.L == 0) return;
  launch_scores_naive(shape, q, k, workspace, stream);
  launch_softmax_fused(shape, workspace, stream);
  launch_pv_naive(shape, workspace, v, out, stream);
}

bool attention_flash_supports(const AttentionShape& shape, const char** reason) {
  const int padded = flash_padded_e(shape.E);
  if (padded == 0) {
    *reason = "E > 128 (the output accumulator is sized in registers at compile time)";
    return false;
  }
  int device = 0, optin = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&device));
  WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (flash_smem_bytes(padded) > static_cast<size_t>(optin)) {
    *reason = "the device has too little shared memory per block for this E";
    return false;
  }
  return true;
}

void attention_flash(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                     float* /*workspace*/, cudaStream_t stream) {
  check_shape("attention_flash", shape, false);
  const char* reason = "";
  WEFT_CHECK(attention_flash_supports(shape, &reason), "attention_flash: E=", shape.E, " is not supported: ", reason);
  if (shape.bh == 0 || shape.L == 0) return;
  switch (flash_padded_e(shape.E)) {
    case 32: launch_flash<32>(shape, q, k, v, out, stream); break;
    case 64: launch_flash<64>(shape, q, k, v, out, stream); break;
    default: launch_flash<128>(shape, q, k, v, out, stream); break;
  }
}

void attention_cublas_math(cublasHandle_t handle, const AttentionShape& shape, const float* q, const float* k,
                           const float* v, float* out, float* workspace, cudaStream_t stream) {
  check_shape("attention_cublas_math", shape, false);
  if (shape.bh == 0 || shape.L == 0) return;
  const int L = shape.L, S = shape.S, E = shape.E;
  const float zero = 0.f, one = 1.f;
  // Column-major cuBLAS sees each row-major matrix transposed. Scores: row-major L x S =
  // q k^T is column-major S x L = k q^T, where k (stored E x S, ld E) is transposed and q
  // (stored E x L, ld E) is not.
  WEFT_CUDA_CHECK(cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, S, L, E, &shape.scale, k, E,
                                            static_cast<long long>(S) * E, q, E, static_cast<long long>(L) * E, &zero,
                                            workspace, S, static_cast<long long>(L) * S, shape.bh));
  launch_softmax_fused(shape, workspace, stream);
  // out: row-major L x E = P v is column-major E x L = v^T P^T, both stored as they are used.
  WEFT_CUDA_CHECK(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, E, L, S, &one, v, E,
                                            static_cast<long long>(S) * E, workspace, S, static_cast<long long>(L) * S,
                                            &zero, out, E, static_cast<long long>(L) * E, shape.bh));
}

}  // namespace weft::dev

#ifndef WEFT_DEV_NO_MAIN

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dev/harness.cuh"

namespace {

using weft::dev::AttentionShape;
using weft::dev::DeviceBuffer;
using weft::dev::download;
using weft::dev::random_uniform;
using weft::dev::upload;

// |out - ref| <= kRtol * sum_j p_j |v_je|, with ref and p in float64. Both products are
// float32 sums of at most S terms whose rounding errors have random signs, and the scores'
// errors move p by a relative ~1e-7; 1e-5 of that bound leaves a wide margin, while an
// indexing or masking bug errs by O(1) of it.
constexpr double kRtol = 1e-5;

// Checks the listed (head, query) rows of `out` against the float64 reference; returns the
// count of elements out of tolerance (NaN counts as wrong).
int64_t count_wrong_rows(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v, const std::vector<float>& out,
                         const std::vector<std::pair<int, int>>& rows) {
  int64_t wrong = 0;
  std::vector<double> p(s.S), ref(s.E), bound(s.E);
  for (const auto& [head, i] : rows) {
    const float* qi = &q[(static_cast<int64_t>(head) * s.L + i) * s.E];
    const int keys = s.causal ? std::min(s.S, i + 1) : s.S;
    double max = -INFINITY;
    for (int j = 0; j < keys; ++j) {
      const float* kj = &k[(static_cast<int64_t>(head) * s.S + j) * s.E];
      double dot = 0;
      for (int e = 0; e < s.E; ++e) dot += static_cast<double>(qi[e]) * kj[e];
      p[j] = dot * s.scale;
      max = std::max(max, p[j]);
    }
    double sum = 0;
    for (int j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - max));
    std::fill(ref.begin(), ref.end(), 0.0);
    std::fill(bound.begin(), bound.end(), 0.0);
    for (int j = 0; j < keys; ++j) {
      const float* vj = &v[(static_cast<int64_t>(head) * s.S + j) * s.E];
      for (int e = 0; e < s.E; ++e) {
        ref[e] += p[j] / sum * vj[e];
        bound[e] += p[j] / sum * std::fabs(vj[e]);
      }
    }
    const float* oi = &out[(static_cast<int64_t>(head) * s.L + i) * s.E];
    for (int e = 0; e < s.E; ++e)
      if (!(std::fabs(oi[e] - ref[e]) <= kRtol * bound[e])) ++wrong;
  }
  return wrong;
}

// A plain cuBLAS handle bound to `stream`, float32 without TF32.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    WEFT_CUDA_CHECK(cublasCreate(&handle_));
    WEFT_CUDA_CHECK(cublasSetStream(handle_, stream));
    WEFT_CUDA_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  }
  ~CublasHandle() {
    if (handle_) cublasDestroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Device copies of q, k, v and buffers for out and the scores.
struct Problem {
  AttentionShape shape;
  std::vector<float> q, k, v;
  DeviceBuffer<float> dq, dk, dv, dout, workspace;

  Problem(const AttentionShape& s, uint32_t seed, cudaStream_t stream)
      : shape(s),
        q(random_uniform(static_cast<int64_t>(s.bh) * s.L * s.E, seed)),
        k(random_uniform(static_cast<int64_t>(s.bh) * s.S * s.E, seed + 1)),
        v(random_uniform(static_cast<int64_t>(s.bh) * s.S * s.E, seed + 2)),
        dq(q.size()),
        dk(k.size()),
        dv(v.size()),
        dout(q.size()),
        workspace(weft::dev::attention_workspace_floats(s)) {
    upload(dq.get(), q, stream);
    upload(dk.get(), k, stream);
    upload(dv.get(), v, stream);
  }

  // NaN bits in out, so that an element a kernel fails to write is counted wrong.
  void poison(cudaStream_t stream) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(dout.get(), 0xff, dout.size() * sizeof(float), stream));
  }
  int64_t wrong(const std::vector<std::pair<int, int>>& rows, cudaStream_t stream) const {
    return count_wrong_rows(shape, q, k, v, download(dout.get(), dout.size(), stream), rows);
  }
};

struct Row {
  std::string variant;
  double ms = 0, tflops = 0, gbs = 0, percent_of_cublas = 0;
  int64_t wrong = 0;
};

// Shaped like the other ladders' files (kernels/dev/harness.cuh), plus GB/s per row and the
// copy bandwidth that gives the memory floor.
bool write_json(const std::string& path, const std::string& device, const std::string& size, int reps,
                int64_t validation_wrong, double copy_gbs, const std::vector<Row>& rows) {
  std::ofstream out(path);
  out.precision(12);
  out << "{\n  \"benchmark\": \"dev_attention\",\n  \"device\": \"" << device << "\",\n  \"size\": \"" << size
      << "\",\n  \"unit\": \"TFLOP/s\",\n  \"limit\": \"cublas_math\",\n  \"reps\": " << reps
      << ",\n  \"validation_wrong\": " << validation_wrong << ",\n  \"copy_gb_per_s\": " << copy_gbs
      << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "    {\"variant\": \"" << r.variant << "\", \"ms\": " << r.ms << ", \"rate\": " << r.tflops
        << ", \"gb_per_s\": " << r.gbs << ", \"percent_of_limit\": " << r.percent_of_cublas
        << ", \"wrong\": " << r.wrong << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
  return static_cast<bool>(out);
}

int usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: dev_attention [--batch B] [--heads H] [--seq T] [--head-dim E] [--causal] [--reps R]\n"
               "                     [--json FILE]\n"
               "  Validates every attention rung and the cuBLAS reference against a float64 CPU reference\n"
               "  on small awkward sizes (causal and not), then times them at B x H heads of T queries and\n"
               "  T keys of dimension E (default 8 x 12 x 1024 x 64, not causal, 20 repetitions).\n"
               "  --causal     time the causal mask (flops counted as half)\n"
               "  --json FILE  also write the timing table as JSON\n"
               "  Exit status: 0 all correct, 1 a result out of tolerance, 2 bad arguments, 77 no CUDA GPU.\n");
  return status;
}

int run(const AttentionShape& timed, int batch, int heads, int reps, const std::string& json_path) {
  using namespace weft::dev;
  cudaStream_t stream;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CublasHandle cublas(stream);
  cudaDeviceProp prop;
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# dev_attention on %s: out = softmax(q k^T / sqrt(E) [+ causal mask]) v, float32\n", prop.name);

  auto run_variant = [&](const char* name, Problem& problem) {
    const AttentionShape& s = problem.shape;
    if (!std::strcmp(name, "cublas_math")) {
      attention_cublas_math(cublas.get(), s, problem.dq.get(), problem.dk.get(), problem.dv.get(),
                            problem.dout.get(), problem.workspace.get(), stream);
      return;
    }
    for (const auto& v : kAttentionVariants)
      if (!std::strcmp(name, v.name))
        v.launch(s, problem.dq.get(), problem.dk.get(), problem.dv.get(), problem.dout.get(),
                 problem.workspace.get(), stream);
  };
  std::vector<const char*> names;
  for (const auto& v : kAttentionVariants) names.push_back(v.name);
  names.push_back("cublas_math");

  // Validation: L, S and E that are not multiples of any tile, S < L and S > L (the causal
  // diagonal then leaves or enters the key range), E = 1, a single query and key.
  std::printf("# validation against float64 CPU: |out - ref| <= %.0e * sum_j p_j |v_je|\n", kRtol);
  std::printf("# %-14s %22s %10s\n", "variant", "bh x L x S x E", "#wrong");
  int64_t total_wrong = 0;
  const int shapes[][4] = {{2, 77, 77, 64}, {3, 100, 37, 24}, {2, 37, 100, 33}, {1, 130, 130, 128},
                           {2, 65, 129, 1}, {1, 1, 1, 8},     {2, 70, 70, 100}};
  uint32_t seed = 1;
  for (const auto& dims : shapes) {
    for (bool causal : {false, true}) {
      AttentionShape s;
      s.bh = dims[0], s.L = dims[1], s.S = dims[2], s.E = dims[3], s.causal = causal;
      s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.E)));
      Problem problem(s, seed, stream);
      seed += 3;
      std::vector<std::pair<int, int>> rows;
      for (int h = 0; h < s.bh; ++h)
        for (int i = 0; i < s.L; ++i) rows.emplace_back(h, i);
      char label[64];
      std::snprintf(label, sizeof label, "%dx%dx%dx%d%s", s.bh, s.L, s.S, s.E, causal ? " causal" : "");
      for (const char* name : names) {
        const char* reason = "";
        if (!std::strcmp(name, "flash") && !attention_flash_supports(s, &reason)) {
          std::printf("  %-14s %22s %10s (%s)\n", name, label, "skipped", reason);
          continue;
        }
        problem.poison(stream);
        run_variant(name, problem);
        const int64_t wrong = problem.wrong(rows, stream);
        total_wrong += wrong;
        std::printf("  %-14s %22s %10lld\n", name, label, static_cast<long long>(wrong));
      }
    }
  }
  const int64_t validation_wrong = total_wrong;

  // Timing at the requested size; every run's result is checked on a few rows of a few heads.
  Problem problem(timed, 101, stream);
  const AttentionShape& s = timed;
  std::vector<std::pair<int, int>> rows;
  for (int h : {0, s.bh / 2, s.bh - 1})
    for (int i : {0, s.L / 3, s.L / 2, s.L - 1}) rows.emplace_back(h, i);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  // FlashAttention's count: two products of 2 L S E flops per head; half of them when causal.
  const double flops = 4.0 * s.bh * s.L * static_cast<double>(s.S) * s.E / (s.causal ? 2 : 1);
  // The least traffic: q, k, v read once, out written once.
  const double bytes = 4.0 * s.bh * static_cast<double>(2 * s.L + 2 * s.S) * s.E;

  // The memory floor: bytes at the device-to-device copy bandwidth (read + written), measured
  // on half of the score workspace (capped at 128 MiB each way).
  const size_t copy_floats = std::min<size_t>(problem.workspace.size() / 2, size_t{32} << 20);
  double copy_gbs = 0;
  if (copy_floats > 0) {
    const double copy_ms = median_ms(stream, 2, reps, [&] {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(problem.workspace.get() + copy_floats, problem.workspace.get(),
                                      copy_floats * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    });
    copy_gbs = 2.0 * copy_floats * sizeof(float) / (copy_ms * 1e-3) / 1e9;
  }

  std::printf("# timing: batch %d x heads %d, L=S=%d, E=%d, %s, median of %d runs (CUDA events), %zu rows checked "
              "per run\n",
              batch, heads, s.L, s.E, s.causal ? "causal" : "not causal", reps, rows.size());
  std::printf("# %.1f GFLOP, %.1f MiB of q, k, v and out; memory floor %.3f ms at the copy bandwidth (%.0f GB/s)\n",
              flops / 1e9, bytes / (1 << 20), copy_gbs > 0 ? bytes / (copy_gbs * 1e9) * 1e3 : 0.0, copy_gbs);
  std::printf("# %-14s %10s %10s %10s %12s %8s\n", "variant", "time", "rate", "traffic", "of cublas", "#wrong");
  std::printf("# %-14s %10s %10s %10s %12s %8s\n", "", "(ms)", "(TFLOP/s)", "(GB/s)", "_math (%)", "");
  std::vector<Row> timing;
  for (const char* name : names) {
    const char* reason = "";
    if (!std::strcmp(name, "flash") && !attention_flash_supports(s, &reason)) {
      std::printf("  %-14s skipped (%s)\n", name, reason);
      continue;
    }
    problem.poison(stream);
    Row row;
    row.variant = name;
    row.ms = median_ms(stream, 2, reps, [&] { run_variant(name, problem); });
    row.wrong = problem.wrong(rows, stream);
    row.tflops = flops / (row.ms * 1e-3) / 1e12;
    row.gbs = bytes / (row.ms * 1e-3) / 1e9;
    total_wrong += row.wrong;
    timing.push_back(row);
  }
  // cublas_math is timed last and printed last; the percentages need its time.
  const double cublas_ms = timing.empty() || timing.back().variant != "cublas_math" ? 0 : timing.back().ms;
  for (Row& row : timing) {
    row.percent_of_cublas = cublas_ms > 0 ? 100.0 * cublas_ms / row.ms : 0;
    std::printf("  %-14s %10.3f %10.2f %10.1f %12.1f %8lld\n", row.variant.c_str(), row.ms, row.tflops, row.gbs,
                row.percent_of_cublas, static_cast<long long>(row.wrong));
  }
  WEFT_CUDA_CHECK(cudaStreamDestroy(stream));
  const std::string size = std::to_string(batch) + "x" + std::to_string(heads) + "x" + std::to_string(s.L) + "x" +
                           std::to_string(s.E) + (s.causal ? " causal" : "");
  if (!json_path.empty() && !write_json(json_path, prop.name, size, reps, validation_wrong, copy_gbs, timing)) {
    std::fprintf(stderr, "dev_attention: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int batch = 8, heads = 12, seq = 1024, head_dim = 64, reps = 20;
  bool causal = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](int& target) {
      if (i + 1 >= argc) return false;
      target = std::atoi(argv[++i]);
      return true;
    };
    bool ok = true;
    if (!std::strcmp(argv[i], "--batch")) ok = value(batch);
    else if (!std::strcmp(argv[i], "--heads")) ok = value(heads);
    else if (!std::strcmp(argv[i], "--seq")) ok = value(seq);
    else if (!std::strcmp(argv[i], "--head-dim")) ok = value(head_dim);
    else if (!std::strcmp(argv[i], "--reps")) ok = value(reps);
    else if (!std::strcmp(argv[i], "--causal")) causal = true;
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(0);
    else ok = false;
    if (!ok) return usage(2);
  }
  if (batch <= 0 || heads <= 0 || seq <= 0 || head_dim <= 0 || reps <= 0) return usage(2);
  if (static_cast<int64_t>(batch) * heads > 65535) {
    std::fprintf(stderr, "dev_attention: batch x heads must be at most 65535\n");
    return 2;
  }
  std::string reason;
  if (!weft::dev::gpu_present(reason)) {
    std::printf("dev_attention: no CUDA GPU (%s)\n", reason.c_str());
    return 77;
  }
  AttentionShape shape;
  shape.bh = batch * heads, shape.L = seq, shape.S = seq, shape.E = head_dim, shape.causal = causal;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  try {
    return run(shape, batch, heads, reps, json_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dev_attention: %s\n", e.what());
    return 1;
  }
}

#endif  // WEFT_DEV_NO_MAIN
