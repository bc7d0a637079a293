// The SGEMM teaching ladder (see sgemm.cuh for the rungs) and, unless WEFT_DEV_NO_MAIN
// is defined, its driver: a float64 CPU reference, validation of every rung and of cuBLAS
// on awkward sizes, then a timing table against cuBLAS.
//
//   dev_sgemm [--size M N K] [--reps R] [--json FILE]   (default 4096 4096 4096, 20 repetitions)
//
// The arithmetic intensity argument behind the ladder: a 4096^3 product does 2 * 4096^3
// flops on 3 * 64 MiB of data, so it is compute-bound only if each value fetched from
// memory is reused many times. Rung 1 reuses nothing in shared memory or registers (its
// speed is L1/L2 bandwidth), rung 2 reuses each global load 32 times through shared
// memory, rungs 3 and 4 also reuse each shared-memory load 8 times through registers.
#include "kernels/dev/sgemm.cuh"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cublas.h"

namespace weft::dev {
namespace {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

void check_sizes(const char* name, int M, int N, int K, int rows_per_block) {
  WEFT_CHECK(M >= 0 && N >= 0 && K >= 0, name, ": sizes must be non-negative, got M=", M, " N=", N, " K=", K);
  // Row tiles go on grid.y, whose limit is 65535 blocks.
  WEFT_CHECK(ceil_div(M, rows_per_block) <= 65535, name, ": M=", M, " needs more than 65535 row tiles of ",
             rows_per_block);
}

// --- 1: naive -------------------------------------------------------------------------
// threadIdx.x runs along a row of C, so a warp reads 32 consecutive floats of a row of B
// (coalesced) and one float of A (a broadcast), and writes 32 consecutive floats of C.
__global__ void sgemm_naive_kernel(int M, int N, int K, const float* __restrict__ A, const float* __restrict__ B,
                                   float* __restrict__ C) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  const float* a = A + static_cast<int64_t>(row) * K;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc = fmaf(a[k], B[static_cast<int64_t>(k) * N + col], acc);
  C[static_cast<int64_t>(row) * N + col] = acc;
}

// --- 2: shared-memory tiles ------------------------------------------------------------
// A 32 x 32 block of threads computes a 32 x 32 tile of C. For every 32-wide slice of K,
// each thread loads one element of A's tile and one of B's (coalesced), the block waits,
// then every thread runs 32 FMAs out of shared memory: As[ty][k] is one address per warp
// (a broadcast) and Bs[k][tx] 32 consecutive words (32 banks), so there are no conflicts.
constexpr int kTile = 32;

__global__ void sgemm_smem_tiled_kernel(int M, int N, int K, const float* __restrict__ A,
                                        const float* __restrict__ B, float* __restrict__ C) {
  __shared__ float As[kTile][kTile];
  __shared__ float Bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;
  const int col = blockIdx.x * kTile + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Out-of-range elements load as 0, so edge tiles need no other special case; threads
    // outside C still load and reach both barriers.
    As[ty][tx] = (row < M && k0 + tx < K) ? A[static_cast<int64_t>(row) * K + k0 + tx] : 0.f;
    Bs[ty][tx] = (k0 + ty < K && col < N) ? B[static_cast<int64_t>(k0 + ty) * N + col] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc = fmaf(As[ty][k], Bs[k][tx], acc);
    __syncthreads();  // the tiles are overwritten by the next slice
  }
  if (row < M && col < N) C[static_cast<int64_t>(row) * N + col] = acc;
}

// --- 3 and 4: register blocking --------------------------------------------------------
// A block of 256 threads computes a 128 x 128 tile of C, walking K in slices of 8. Each
// thread keeps 8 x 8 results in registers; per k it reads 8 values of A and 8 of B from
// shared memory and does 64 FMAs with them.
constexpr int kBM = 128, kBN = 128, kBK = 8;
constexpr int kThreads = 256;  // 16 x 16 threads, each 8 x 8 results
constexpr int kTM = 8, kTN = 8;

// Rung 3: scalar loads. Thread (ty, tx) owns rows ty + 16 i and columns tx + 16 j of the
// tile: the 16 threads of a half-warp then read 16 consecutive words of Bs (no bank
// conflicts) and a warp reads 2 distinct words of As per step (2 broadcasts).
__global__ void __launch_bounds__(kThreads) sgemm_regblock_kernel(int M, int N, int K, const float* __restrict__ A,
                                                                  const float* __restrict__ B,
                                                                  float* __restrict__ C) {
  __shared__ float As[kBM][kBK];
  __shared__ float Bs[kBK][kBN];
  const int t = threadIdx.x;
  const int tx = t % 16, ty = t / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBN;

  float acc[kTM][kTN] = {};
  for (int k0 = 0; k0 < K; k0 += kBK) {
    // 128 x 8 elements of A and 8 x 128 of B: 4 of each per thread. Consecutive threads
    // take consecutive elements, so global reads are coalesced and shared stores
    // conflict-free.
#pragma unroll
    for (int r = 0; r < (kBM * kBK) / kThreads; ++r) {
      const int e = t + r * kThreads;
      const int am = e / kBK, ak = e % kBK;
      const int64_t arow = row0 + am;
      As[am][ak] = (arow < M && k0 + ak < K) ? A[arow * K + k0 + ak] : 0.f;
      const int bk = e / kBN, bn = e % kBN;
      const int64_t bcol = col0 + bn;
      Bs[bk][bn] = (k0 + bk < K && bcol < N) ? B[static_cast<int64_t>(k0 + bk) * N + bcol] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = As[ty + 16 * i][k];
#pragma unroll
      for (int j = 0; j < kTN; ++j) b[j] = Bs[k][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= M) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t col = col0 + tx + 16 * j;
      if (col < N) C[row * N + col] = acc[i][j];
    }
  }
}

// Rung 4: float4 everywhere. Thread (ty, tx) owns the rows {4 ty .. 4 ty + 3} and
// {64 + 4 ty .. 64 + 4 ty + 3} of the tile, and the same two groups of 4 columns with tx:
// its 8 values of B per k are two float4 reads, and a half-warp's 16 float4 reads cover
// 256 consecutive bytes (conflict-free). A is stored transposed (As[k][m]) so that its 8
// values per k are two float4 reads as well. Rows of As are padded to 132 floats: the
// transposing stores of the two threads that share a row of A (k 0-3 and k 4-7) then land
// 16 banks apart instead of on the same bank, and 132 * 4 bytes keeps float4 alignment.
//
// Double buffering: the next slice's float4s are fetched into registers before the
// current slice's FMAs, so global latency overlaps arithmetic; they are stored into the
// other shared buffer afterwards. One barrier per slice suffices: a buffer is written one
// iteration after it was last read, with that iteration's barrier in between.
constexpr int kAsPad = 4;

struct alignas(16) VecTiles {
  float As[2][kBK][kBM + kAsPad];
  float Bs[2][kBK][kBN];
};

__device__ __forceinline__ float4 load4_or_zero(const float* p, bool in_range) {
  return in_range ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
}

__global__ void __launch_bounds__(kThreads, 2) sgemm_vectorised_kernel(int M, int N, int K,
                                                                       const float* __restrict__ A,
                                                                       const float* __restrict__ B,
                                                                       float* __restrict__ C) {
  __shared__ VecTiles tiles;
  const int t = threadIdx.x;
  const int tx = t % 16, ty = t / 16;
  const int row0 = blockIdx.y * kBM;
  const int col0 = blockIdx.x * kBN;

  // Which float4 of each slice this thread moves: A's 128 x 8 slice is 2 float4 per row
  // (thread t: row t / 2, k 0-3 or 4-7); B's 8 x 128 slice is 32 float4 per row (a warp
  // reads one full 512-byte row). N % 4 == 0 and K % 4 == 0, so a float4 is either
  // entirely inside the matrix or entirely outside; outside ones read as zeros without
  // touching memory, which also makes the fetch past the last slice harmless, so the
  // loop below needs no special last iteration (and stays within 128 registers).
  const int a_m = t / 2, a_k = (t % 2) * 4;
  const int b_k = t / 32, b_n = (t % 32) * 4;
  const bool a_row_ok = row0 + a_m < M;
  const bool b_col_ok = col0 + b_n < N;
  const float* a_src = A + static_cast<int64_t>(row0 + a_m) * K + a_k;
  const float* b_src = B + static_cast<int64_t>(b_k) * N + col0 + b_n;
  const int64_t b_step = static_cast<int64_t>(kBK) * N;
  int k_left = K;  // of the slice that the next fetch reads
  float4 av, bv;
  auto fetch = [&]() {
    av = load4_or_zero(a_src, a_row_ok && a_k < k_left);
    bv = load4_or_zero(b_src, b_col_ok && b_k < k_left);
    a_src += kBK;
    b_src += b_step;
    k_left -= kBK;
  };
  auto stash = [&](int buf) {
    tiles.As[buf][a_k + 0][a_m] = av.x;
    tiles.As[buf][a_k + 1][a_m] = av.y;
    tiles.As[buf][a_k + 2][a_m] = av.z;
    tiles.As[buf][a_k + 3][a_m] = av.w;
    *reinterpret_cast<float4*>(&tiles.Bs[buf][b_k][b_n]) = bv;
  };
  float acc[kTM][kTN] = {};
  const int slices = ceil_div(K, kBK);
  fetch();
  stash(0);
  __syncthreads();
  for (int s = 0; s < slices; ++s) {
    const int cur = s & 1;
    fetch();  // the next slice: its global loads are in flight during the FMAs
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(&tiles.As[cur][k][4 * ty]);
      const float4 a1 = *reinterpret_cast<const float4*>(&tiles.As[cur][k][64 + 4 * ty]);
      const float4 b0 = *reinterpret_cast<const float4*>(&tiles.Bs[cur][k][4 * tx]);
      const float4 b1 = *reinterpret_cast<const float4*>(&tiles.Bs[cur][k][64 + 4 * tx]);
      const float a[kTM] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float b[kTN] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    stash(cur ^ 1);
    __syncthreads();
  }

  // Each thread writes 8 rows x 2 float4: a half-warp writes 256 consecutive bytes.
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int row = row0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + (i - 4));
    if (row >= M) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = col0 + 64 * half + 4 * tx;
      if (col < N)
        *reinterpret_cast<float4*>(C + static_cast<int64_t>(row) * N + col) =
            make_float4(acc[i][4 * half], acc[i][4 * half + 1], acc[i][4 * half + 2], acc[i][4 * half + 3]);
    }
  }
}

}  // namespace

void sgemm_naive(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream) {
  check_sizes("sgemm_naive", M, N, K, 8);
  if (M == 0 || N == 0) return;
  dim3 block(32, 8);
  dim3 grid(ceil_div(N, 32), ceil_div(M, 8));
  sgemm_naive_kernel<<<grid, block, 0, stream>>>(M, N, K, A, B, C);
  WEFT_CUDA_CHECK_LAUNCH();
}

void sgemm_smem_tiled(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream) {
  check_sizes("sgemm_smem_tiled", M, N, K, kTile);
  if (M == 0 || N == 0) return;
  dim3 block(kTile, kTile);
  dim3 grid(ceil_div(N, kTile), ceil_div(M, kTile));
  sgemm_smem_tiled_kernel<<<grid, block, 0, stream>>>(M, N, K, A, B, C);
  WEFT_CUDA_CHECK_LAUNCH();
}

void sgemm_regblock(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream) {
  check_sizes("sgemm_regblock", M, N, K, kBM);
  if (M == 0 || N == 0) return;
  dim3 grid(ceil_div(N, kBN), ceil_div(M, kBM));
  sgemm_regblock_kernel<<<grid, kThreads, 0, stream>>>(M, N, K, A, B, C);
  WEFT_CUDA_CHECK_LAUNCH();
}

bool sgemm_vectorised_supports(int M, int N, int K, const float* A, const float* B, float* C) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return M >= 0 && N % 4 == 0 && K % 4 == 0 && aligned(A) && aligned(B) && aligned(C);
}

void sgemm_vectorised(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream) {
  check_sizes("sgemm_vectorised", M, N, K, kBM);
  WEFT_CHECK(sgemm_vectorised_supports(M, N, K, A, B, C),
             "sgemm_vectorised: needs N and K multiples of 4 and 16-byte aligned A, B, C (float4 accesses), got M=",
             M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  dim3 grid(ceil_div(N, kBN), ceil_div(M, kBM));
  sgemm_vectorised_kernel<<<grid, kThreads, 0, stream>>>(M, N, K, A, B, C);
  WEFT_CUDA_CHECK_LAUNCH();
}

void sgemm_cublas(cublasHandle_t handle, int M, int N, int K, const float* A, const float* B, float* C) {
  if (M == 0 || N == 0) return;
  const float alpha = 1.f, beta = 0.f;
  // Column-major cuBLAS sees row-major B (K x N) as B^T (N x K, ld N) and A as A^T
  // (K x M, ld K); B^T·A^T = (A·B)^T, which it writes as C^T (N x M, ld N): row-major C.
  WEFT_CUDA_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha, B, std::max(N, 1), A,
                              std::max(K, 1), &beta, C, std::max(N, 1)));
}

RawCublasHandle::RawCublasHandle(cudaStream_t stream) {
  WEFT_CUDA_CHECK(cublasCreate(&handle_));
  WEFT_CUDA_CHECK(cublasSetStream(handle_, stream));
  WEFT_CUDA_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

RawCublasHandle::~RawCublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

}  // namespace weft::dev

#ifndef WEFT_DEV_NO_MAIN

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dev/harness.cuh"

namespace {

using weft::dev::DeviceBuffer;
using weft::dev::download;
using weft::dev::random_uniform;
using weft::dev::upload;

// |C - ref| <= kRtol * sum_k |A_ik B_kj|, with ref accumulated in float64. A float32 dot
// product of K terms errs by about 2^-24 of that sum (rounding errors of random sign);
// 1e-5 leaves a margin of ~100x, while an indexing bug errs by O(1) of it.
constexpr double kRtol = 1e-5;

// Checks the listed rows of C against the float64 reference; returns the count of
// elements out of tolerance (NaN counts as wrong).
int64_t count_wrong_rows(const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& C,
                         int N, int K, const std::vector<int>& rows) {
  int64_t wrong = 0;
  std::vector<double> ref(N), scale(N);
  for (int row : rows) {
    std::fill(ref.begin(), ref.end(), 0.0);
    std::fill(scale.begin(), scale.end(), 0.0);
    for (int k = 0; k < K; ++k) {
      const double a = A[static_cast<int64_t>(row) * K + k];
      const float* b = &B[static_cast<int64_t>(k) * N];
      for (int j = 0; j < N; ++j) {
        ref[j] += a * b[j];
        scale[j] += std::fabs(a * b[j]);
      }
    }
    for (int j = 0; j < N; ++j) {
      const double err = std::fabs(C[static_cast<int64_t>(row) * N + j] - ref[j]);
      if (!(err <= kRtol * scale[j])) ++wrong;
    }
  }
  return wrong;
}

// Runs one rung (or cuBLAS) on fresh device copies of A and B and returns C; C starts as
// NaN so that an element a kernel forgets to write is caught.
template <class Run>
std::vector<float> run_once(int M, int N, const std::vector<float>& A, const std::vector<float>& B, cudaStream_t stream,
                            Run&& run) {
  DeviceBuffer<float> dA(A.size()), dB(B.size()), dC(static_cast<size_t>(M) * N);
  upload(dA.get(), A, stream);
  upload(dB.get(), B, stream);
  WEFT_CUDA_CHECK(cudaMemsetAsync(dC.get(), 0xff, dC.size() * sizeof(float), stream));  // all-ones bits: NaN
  run(dA.get(), dB.get(), dC.get());
  return download(dC.get(), dC.size(), stream);
}

int usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: dev_sgemm [--size M N K] [--reps R] [--json FILE]\n"
               "  Validates every SGEMM rung and cuBLAS against a float64 CPU reference on small\n"
               "  awkward sizes, then times them at M x N x K (default 4096^3, 20 repetitions).\n"
               "  --json FILE  also write the timing table as JSON\n"
               "  Exit status: 0 all correct, 1 a result out of tolerance, 2 bad arguments,\n"
               "  77 no CUDA GPU.\n");
  return status;
}

int run(int M, int N, int K, int reps, const std::string& json_path) {
  using namespace weft::dev;
  cudaStream_t stream;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RawCublasHandle cublas(stream);
  cudaDeviceProp prop;
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# dev_sgemm on %s: row-major C = A·B, float32\n", prop.name);

  // Validation: sizes that are not multiples of any tile, K smaller than a slice, K = 0.
  // Rung 4 takes only N, K multiples of 4; it is skipped (and says so) on the others.
  std::printf("# validation against float64 CPU: |C - ref| <= %.0e * sum_k |A_ik B_kj|\n", kRtol);
  std::printf("# %-12s %16s %10s\n", "variant", "M x N x K", "#wrong");
  int64_t total_wrong = 0;
  const int shapes[][3] = {{509, 383, 257}, {300, 1004, 516}, {128, 256, 64}, {33, 20, 4}, {5, 8, 0}};
  for (const auto& shape : shapes) {
    const int m = shape[0], n = shape[1], k = shape[2];
    auto A = random_uniform(static_cast<int64_t>(m) * k, 1), B = random_uniform(static_cast<int64_t>(k) * n, 2);
    std::vector<int> rows(m);
    for (int i = 0; i < m; ++i) rows[i] = i;
    char dims[48];
    std::snprintf(dims, sizeof dims, "%dx%dx%d", m, n, k);
    auto report = [&](const char* name, const std::vector<float>& C) {
      int64_t wrong = count_wrong_rows(A, B, C, n, k, rows);
      total_wrong += wrong;
      std::printf("  %-12s %16s %10lld\n", name, dims, static_cast<long long>(wrong));
    };
    for (const auto& v : kSgemmVariants) {
      if (v.launch == &sgemm_vectorised && (n % 4 != 0 || k % 4 != 0)) {
        std::printf("  %-12s %16s %10s\n", v.name, dims, "skipped (N, K not multiples of 4)");
        continue;
      }
      report(v.name, run_once(m, n, A, B, stream, [&](const float* a, const float* b, float* c) {
               v.launch(m, n, k, a, b, c, stream);
             }));
    }
    report("cublas", run_once(m, n, A, B, stream, [&](const float* a, const float* b, float* c) {
             sgemm_cublas(cublas.get(), m, n, k, a, b, c);
           }));
  }

  const int64_t validation_wrong = total_wrong;

  // Timing at the requested size; each result is also checked on a few rows.
  auto A = random_uniform(static_cast<int64_t>(M) * K, 3), B = random_uniform(static_cast<int64_t>(K) * N, 4);
  DeviceBuffer<float> dA(A.size()), dB(B.size()), dC(static_cast<size_t>(M) * N);
  upload(dA.get(), A, stream);
  upload(dB.get(), B, stream);
  std::vector<int> rows = {0, M / 3, M / 2, M - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const double flops = 2.0 * M * N * static_cast<double>(K);

  auto measure = [&](auto&& launch, int64_t& wrong) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(dC.get(), 0xff, dC.size() * sizeof(float), stream));
    double ms = median_ms(stream, 2, reps, launch);
    wrong = count_wrong_rows(A, B, download(dC.get(), dC.size(), stream), N, K, rows);
    total_wrong += wrong;
    return ms;
  };
  int64_t cublas_wrong = 0;
  const double cublas_ms =
      measure([&] { sgemm_cublas(cublas.get(), M, N, K, dA.get(), dB.get(), dC.get()); }, cublas_wrong);

  std::printf("# timing: M=%d N=%d K=%d, median of %d runs (CUDA events), %zu rows checked per run\n", M, N, K,
              reps, rows.size());
  std::printf("# %-12s %10s %10s %10s %8s\n", "variant", "time", "rate", "of cuBLAS", "#wrong");
  std::printf("# %-12s %10s %10s %10s %8s\n", "", "(ms)", "(TFLOP/s)", "(%)", "");
  std::vector<TimingRow> timing;
  auto row = [&](const char* name, double ms, int64_t wrong) {
    timing.push_back({name, ms, flops / (ms * 1e-3) / 1e12, 100.0 * cublas_ms / ms, wrong});
    std::printf("  %-12s %10.3f %10.2f %10.1f %8lld\n", name, ms, timing.back().rate, timing.back().percent_of_limit,
                static_cast<long long>(wrong));
  };
  for (const auto& v : kSgemmVariants) {
    if (v.launch == &sgemm_vectorised && !sgemm_vectorised_supports(M, N, K, dA.get(), dB.get(), dC.get())) {
      std::printf("  %-12s skipped (N, K not multiples of 4)\n", v.name);
      continue;
    }
    int64_t wrong = 0;
    double ms = measure([&] { v.launch(M, N, K, dA.get(), dB.get(), dC.get(), stream); }, wrong);
    row(v.name, ms, wrong);
  }
  row("cublas", cublas_ms, cublas_wrong);
  WEFT_CUDA_CHECK(cudaStreamDestroy(stream));
  const std::string size = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  if (!json_path.empty() &&
      !write_timing_json(json_path, "dev_sgemm", prop.name, size, "TFLOP/s", "cublas", reps, validation_wrong,
                         timing)) {
    std::fprintf(stderr, "dev_sgemm: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int M = 4096, N = 4096, K = 4096, reps = 20;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--size") && i + 3 < argc) {
      M = std::atoi(argv[++i]);
      N = std::atoi(argv[++i]);
      K = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      return usage(0);
    } else {
      return usage(2);
    }
  }
  if (M <= 0 || N <= 0 || K <= 0 || reps <= 0) return usage(2);
  std::string reason;
  if (!weft::dev::gpu_present(reason)) {
    std::printf("dev_sgemm: no CUDA GPU (%s)\n", reason.c_str());
    return 77;
  }
  try {
    return run(M, N, K, reps, json_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dev_sgemm: %s\n", e.what());
    return 1;
  }
}

#endif  // WEFT_DEV_NO_MAIN
