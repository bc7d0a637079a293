// The sum-reduction teaching ladder (see reduce_sum.cuh for the rungs) and, unless
// WEFT_DEV_NO_MAIN is defined, its driver: a float64 CPU reference, validation of every
// rung on awkward sizes and an unaligned start, then a timing table against the
// device-to-device copy bandwidth measured in the same run.
//
//   dev_reduce_sum [--mib M] [--reps R] [--json FILE]   (default 256 MiB of float32, 20 repetitions)
//
// The limit: a sum reads 4 bytes per element and writes nothing, so its floor is
// n * 4 bytes / read bandwidth. cudaMemcpy D2D reads and writes, so its bytes moved per
// second (read + written) is the "copy bandwidth" that rungs are compared with.
#include "kernels/dev/reduce_sum.cuh"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/check.h"

namespace weft::dev {
namespace {

constexpr int kBlock = 256;
constexpr int kNaiveChunk = 256;      // rung 1: elements per thread
constexpr int kShuffleBlocks = 1024;  // rung 3: a fixed grid (about one wave on an H100), so
                                      // the summation order, hence the result, is the same on
                                      // every run and every GPU

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up4(int64_t a) { return (a + 3) / 4 * 4; }

// Partial sums one pass of each rung leaves from `count` values.
int64_t naive_partials(int64_t count) { return ceil_div(count, kNaiveChunk); }
int64_t tree_partials(int64_t count) { return ceil_div(count, 2 * kBlock); }
int64_t shuffle_partials(int64_t count) {
  return std::clamp<int64_t>(ceil_div(count, 4 * kBlock), 1, kShuffleBlocks);
}

// Two buffers alternate as a pass's input and output: the first holds at most the first
// pass's partials, the second the second pass's. The first is rounded up to 4 floats so
// that the second stays 16-byte aligned for rung 3's float4 loads.
template <class Partials>
int64_t workspace_floats(int64_t n, Partials partials) {
  if (n <= 1) return 0;
  const int64_t first = partials(n);
  return round_up4(first) + partials(first);
}

// Runs passes until one value remains; the last pass writes `out`.
// launch(in, count, dst, partials) reduces `count` values at `in` into `partials` at `dst`.
template <class Partials, class Launch>
void reduce_passes(const char* name, const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream,
                   Partials partials, Launch launch) {
  WEFT_CHECK(n >= 0, name, ": n must be non-negative, got ", n);
  if (n == 0) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream));
    return;
  }
  float* buffers[2] = {workspace, workspace + (n > 1 ? round_up4(partials(n)) : 0)};
  const float* in = x;
  int64_t count = n;
  for (int pass = 0;; ++pass) {
    const int64_t p = partials(count);
    float* dst = p == 1 ? out : buffers[pass % 2];
    launch(in, count, dst, p);
    if (p == 1) return;
    in = dst;
    count = p;
  }
}

// --- 1: naive ------------------------------------------------------------------------
// Thread t sums x[t * 256, t * 256 + 256). Simple and atomics-free, but at each step the
// 32 threads of a warp touch 32 different 32-byte sectors 1 KiB apart, and rely on L1 to
// keep each sector until its other 7 floats are used.
__global__ void reduce_naive_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ partials) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t begin = t * kNaiveChunk;
  if (begin >= n) return;
  const int64_t end = begin + kNaiveChunk < n ? begin + kNaiveChunk : n;
  float acc = 0.f;
  for (int64_t i = begin; i < end; ++i) acc += x[i];
  partials[t] = acc;
}

// --- 2: shared-memory tree -------------------------------------------------------------
// Block b sums x[b * 512, b * 512 + 512): each thread adds two elements 256 apart while
// loading (both loads coalesced), then the block halves the 256 values in shared memory.
// Sequential addressing (thread i adds s[i + stride]) keeps the active threads in whole
// warps and reads consecutive words, so there are no bank conflicts. Every level needs a
// barrier, and most threads idle in the upper levels: this is what rung 3 removes.
__global__ void reduce_smem_tree_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ partials) {
  __shared__ float s[kBlock];
  const int tid = threadIdx.x;
  const int64_t i = blockIdx.x * static_cast<int64_t>(2 * kBlock) + tid;
  float v = i < n ? x[i] : 0.f;
  if (i + kBlock < n) v += x[i + kBlock];
  s[tid] = v;
  __syncthreads();
  for (int stride = kBlock / 2; stride > 0; stride /= 2) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) partials[blockIdx.x] = s[0];
}

// --- 3: warp shuffle, grid stride, float4 ---------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;  // complete in lane 0
}

__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// A fixed grid strides over the vector as float4s: few blocks, each thread with 4
// independent 16-byte loads in flight per iteration, which is what keeps enough bytes in
// flight to saturate HBM. The up to 3 elements before the first 16-byte boundary and the
// up to 3 after the last float4 are added by the first threads. Within a block, warps
// reduce their registers with shuffles (no shared memory, no barrier), and one barrier
// lets warp 0 combine the 8 warp sums.
__global__ void __launch_bounds__(kBlock) reduce_warp_shuffle_kernel(const float* __restrict__ x, int64_t n,
                                                                     float* __restrict__ partials) {
  const int64_t misalign = (reinterpret_cast<uintptr_t>(x) % 16) / sizeof(float);
  const int64_t head = n < (4 - misalign) % 4 ? n : (4 - misalign) % 4;
  const float4* v = reinterpret_cast<const float4*>(x + head);
  const int64_t nvec = (n - head) / 4;
  const int64_t tail_begin = head + 4 * nvec;

  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc = 0.f;
  int64_t i = tid;
  for (; i + 3 * stride < nvec; i += 4 * stride) {
    const float4 a = v[i], b = v[i + stride], c = v[i + 2 * stride], d = v[i + 3 * stride];
    acc += (sum4(a) + sum4(b)) + (sum4(c) + sum4(d));
  }
  for (; i < nvec; i += stride) acc += sum4(v[i]);
  if (tid < head) acc += x[tid];
  if (tid < n - tail_begin) acc += x[tail_begin + tid];

  __shared__ float warp_sums[kBlock / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  acc = warp_sum(acc);
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = warp_sum(lane < kBlock / 32 ? warp_sums[lane] : 0.f);
    if (lane == 0) partials[blockIdx.x] = acc;
  }
}

}  // namespace

int64_t reduce_sum_workspace_floats(int64_t n) {
  return std::max({workspace_floats(n, naive_partials), workspace_floats(n, tree_partials),
                   workspace_floats(n, shuffle_partials)});
}

void reduce_sum_naive(const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream) {
  reduce_passes("reduce_sum_naive", x, n, out, workspace, stream, naive_partials,
                [&](const float* in, int64_t count, float* dst, int64_t partials) {
                  const int64_t blocks = ceil_div(partials, kBlock);  // one thread per partial
                  reduce_naive_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(in, count, dst);
                  WEFT_CUDA_CHECK_LAUNCH();
                });
}

void reduce_sum_smem_tree(const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream) {
  WEFT_CHECK(tree_partials(n) <= 0x7fffffff, "reduce_sum_smem_tree: n=", n, " needs more than 2^31 - 1 blocks");
  reduce_passes("reduce_sum_smem_tree", x, n, out, workspace, stream, tree_partials,
                [&](const float* in, int64_t count, float* dst, int64_t partials) {
                  reduce_smem_tree_kernel<<<static_cast<unsigned>(partials), kBlock, 0, stream>>>(in, count, dst);
                  WEFT_CUDA_CHECK_LAUNCH();
                });
}

void reduce_sum_warp_shuffle(const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream) {
  reduce_passes("reduce_sum_warp_shuffle", x, n, out, workspace, stream, shuffle_partials,
                [&](const float* in, int64_t count, float* dst, int64_t partials) {
                  reduce_warp_shuffle_kernel<<<static_cast<unsigned>(partials), kBlock, 0, stream>>>(in, count, dst);
                  WEFT_CUDA_CHECK_LAUNCH();
                });
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
using weft::dev::random_uniform;

// |sum - ref| <= kRtol * sum |x|, ref accumulated in float64. Float32 partial sums err by
// a few 2^-24 of that (rounding errors of random sign over chunks of a few hundred);
// 1e-5 leaves a wide margin, while a skipped or doubled element errs by ~1 / n of it.
constexpr double kRtol = 1e-5;

struct Reference {
  double sum = 0, abs_sum = 0;
};

Reference reference_sum(const float* x, int64_t n) {
  Reference r;
  for (int64_t i = 0; i < n; ++i) {
    r.sum += x[i];
    r.abs_sum += std::fabs(x[i]);
  }
  return r;
}

bool close_enough(float got, const Reference& ref) {
  return std::fabs(got - ref.sum) <= kRtol * ref.abs_sum;  // NaN fails; n == 0 needs exactly 0
}

// Runs one rung with `out` poisoned (NaN) first, and returns what it wrote.
float run_once(const weft::dev::ReduceSumVariant& v, const float* x, int64_t n, float* out, float* workspace,
               cudaStream_t stream) {
  WEFT_CUDA_CHECK(cudaMemsetAsync(out, 0xff, sizeof(float), stream));
  v.launch(x, n, out, workspace, stream);
  float got = 0;
  WEFT_CUDA_CHECK(cudaMemcpyAsync(&got, out, sizeof(float), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return got;
}

int usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: dev_reduce_sum [--mib M] [--reps R] [--json FILE]\n"
               "  Validates every sum-reduction rung against a float64 CPU reference on awkward sizes,\n"
               "  then times them on M MiB of float32 (default 256, 20 repetitions) beside a\n"
               "  device-to-device copy of the same bytes.\n"
               "  --json FILE  also write the timing table as JSON\n"
               "  Exit status: 0 all correct, 1 a result out of tolerance, 2 bad arguments,\n"
               "  77 no CUDA GPU.\n");
  return status;
}

int run(int64_t n, int reps, const std::string& json_path) {
  using namespace weft::dev;
  cudaStream_t stream;
  WEFT_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# dev_reduce_sum on %s: sum of float32\n", prop.name);

  // One buffer of n + 1 values serves both phases: validation sizes are prefixes of it,
  // and x + 1 checks a start that is not 16-byte aligned.
  const int64_t validation_sizes[] = {0, 1, 7, 1000003, int64_t{1} << 24};
  const int64_t capacity = std::max(n, validation_sizes[4]) + 1;
  const std::vector<float> host = random_uniform(capacity, 1);
  DeviceBuffer<float> x(capacity), out(1), workspace(std::max<int64_t>(reduce_sum_workspace_floats(capacity), 1));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(x.get(), host.data(), capacity * sizeof(float), cudaMemcpyHostToDevice, stream));

  std::printf("# validation against float64 CPU: |sum - ref| <= %.0e * sum |x|\n", kRtol);
  std::printf("# %-14s %10s %8s %8s\n", "variant", "n", "offset", "#wrong");
  int64_t total_wrong = 0;
  for (int64_t size : validation_sizes) {
    for (int offset : {0, 1}) {
      if (offset == 1 && size == 0) continue;
      const Reference ref = reference_sum(host.data() + offset, size);
      for (const auto& v : kReduceSumVariants) {
        const float got = run_once(v, x.get() + offset, size, out.get(), workspace.get(), stream);
        const int wrong = close_enough(got, ref) ? 0 : 1;
        total_wrong += wrong;
        std::printf("  %-14s %10lld %8d %8d\n", v.name, static_cast<long long>(size), offset, wrong);
      }
    }
  }

  const int64_t validation_wrong = total_wrong;

  const double bytes = static_cast<double>(n) * sizeof(float);
  const Reference ref = reference_sum(host.data(), n);
  DeviceBuffer<float> copy(n);
  const double copy_ms = median_ms(stream, 2, reps, [&] {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(copy.get(), x.get(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = 2 * bytes / (copy_ms * 1e-3) / 1e9;  // read + written

  std::printf("# timing: n=%lld (%.0f MiB), median of %d runs (CUDA events); limit: D2D copy %.1f GB/s\n",
              static_cast<long long>(n), bytes / (1 << 20), reps, copy_gbs);
  std::printf("# %-14s %10s %10s %10s %8s\n", "variant", "time", "rate", "of copy", "#wrong");
  std::printf("# %-14s %10s %10s %10s %8s\n", "", "(ms)", "(GB/s)", "(%)", "");
  std::printf("  %-14s %10.4f %10.1f %10.1f %8s\n", "d2d_copy", copy_ms, copy_gbs, 100.0, "-");
  std::vector<TimingRow> timing = {{"d2d_copy", copy_ms, copy_gbs, 100.0, 0}};
  for (const auto& v : kReduceSumVariants) {
    const double ms =
        median_ms(stream, 2, reps, [&] { v.launch(x.get(), n, out.get(), workspace.get(), stream); });
    const int wrong = close_enough(run_once(v, x.get(), n, out.get(), workspace.get(), stream), ref) ? 0 : 1;
    total_wrong += wrong;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    timing.push_back({v.name, ms, gbs, 100.0 * gbs / copy_gbs, wrong});
    std::printf("  %-14s %10.4f %10.1f %10.1f %8d\n", v.name, ms, gbs, 100.0 * gbs / copy_gbs, wrong);
  }
  WEFT_CUDA_CHECK(cudaStreamDestroy(stream));
  const std::string size = std::to_string(n) + " float32";
  if (!json_path.empty() &&
      !write_timing_json(json_path, "dev_reduce_sum", prop.name, size, "GB/s", "d2d_copy", reps, validation_wrong,
                         timing)) {
    std::fprintf(stderr, "dev_reduce_sum: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 256;
  int reps = 20;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) mib = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(0);
    else return usage(2);
  }
  if (mib <= 0 || reps <= 0) return usage(2);
  std::string reason;
  if (!weft::dev::gpu_present(reason)) {
    std::printf("dev_reduce_sum: no CUDA GPU (%s)\n", reason.c_str());
    return 77;
  }
  try {
    return run(mib * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(float)), reps, json_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dev_reduce_sum: %s\n", e.what());
    return 1;
  }
}

#endif  // WEFT_DEV_NO_MAIN
