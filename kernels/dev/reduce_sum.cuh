// Teaching ladder for the sum of a float32 vector, from a naive kernel to one that runs at
// the speed of memory. A sum reads each element once and does one add per element, so
// its limit is memory bandwidth; each rung removes what keeps it below that:
//
//   1 naive         each thread adds a contiguous chunk of 256 elements: no cooperation,
//                   but neighbouring threads read addresses 1 KiB apart (uncoalesced)
//   2 smem_tree     a block loads 512 consecutive elements (coalesced) and halves them in
//                   shared memory, with a barrier per level
//   3 warp_shuffle  a fixed grid of threads strides over the vector in float4 loads (four
//                   in flight per thread), then registers are combined with warp shuffles
//                   and a single barrier per block
//
// Every rung is atomics-free and deterministic: a pass writes one partial sum per thread
// (rung 1) or per block (rungs 2, 3), and the same kernel runs again over the partials
// until one value remains, written to `out` (device memory). Accumulation is float32.
// `workspace` holds the partials: reduce_sum_workspace_floats(n) floats. n == 0 gives 0.
// Launchers run on `stream`, never synchronise, and check every launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::dev {

int64_t reduce_sum_workspace_floats(int64_t n);

void reduce_sum_naive(const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream);
void reduce_sum_smem_tree(const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream);
void reduce_sum_warp_shuffle(const float* x, int64_t n, float* out, float* workspace, cudaStream_t stream);

// The rungs by number, for tables and command lines.
using ReduceSumLauncher = void (*)(const float*, int64_t, float*, float*, cudaStream_t);
struct ReduceSumVariant {
  int number;
  const char* name;
  ReduceSumLauncher launch;
};
inline constexpr ReduceSumVariant kReduceSumVariants[] = {
    {1, "naive", &reduce_sum_naive},
    {2, "smem_tree", &reduce_sum_smem_tree},
    {3, "warp_shuffle", &reduce_sum_warp_shuffle},
};

}  // namespace weft::dev
