// Deterministic reductions across lanes of a warp, a whole thread block, or the rows of
// a thread tile (CUDA-only header), shared by the reduction, softmax and loss kernels.
//
// Note [Fixed reduction trees]: every helper here combines values in a tree whose shape
// depends only on the group's size, never on timing, and none uses atomics. A kernel
// that gives each output to one group, with an assignment of elements to lanes that
// depends only on the shape, is therefore bitwise reproducible from run to run.
// combine(a, b) always gets the value of the lower lane (or tile row) first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace weft::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Warp shuffles of arithmetic values (narrow types travel as int). A struct that is
// reduced across lanes gets overloads of its own beside its type, found by
// argument-dependent lookup.
template <class V, std::enable_if_t<std::is_arithmetic_v<V>, int> = 0>
__device__ __forceinline__ V shfl_down(V v, unsigned delta, int width) {
  if constexpr (sizeof(V) < sizeof(int)) {
    return static_cast<V>(__shfl_down_sync(kFullMask, static_cast<int>(v), delta, width));
  } else {
    return __shfl_down_sync(kFullMask, v, delta, width);
  }
}

template <class V, std::enable_if_t<std::is_arithmetic_v<V>, int> = 0>
__device__ __forceinline__ V shfl(V v, int src_lane, int width) {
  if constexpr (sizeof(V) < sizeof(int)) {
    return static_cast<V>(__shfl_sync(kFullMask, static_cast<int>(v), src_lane, width));
  } else {
    return __shfl_sync(kFullMask, v, src_lane, width);
  }
}

// Reduces v over each aligned group of G lanes (G a power of two <= 32); the group's
// first lane ends with the result. Every lane of the warp must call it (the shuffles
// use the full mask), active or not.
template <int G, class V, class Combine>
__device__ __forceinline__ V group_reduce(V v, const Combine& combine) {
  static_assert(G >= 1 && G <= kWarpSize && (G & (G - 1)) == 0, "lane groups are powers of two up to a warp");
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) v = combine(v, shfl_down(v, offset, G));
  return v;
}

// Reduces v over the block (kThreads threads, a multiple of 32): warps first, then the
// first warp over the warps' results. Thread 0 ends with the result. Every thread must
// call it; `scratch` is shared memory for kThreads / 32 + 1 values, reusable right after
// (the leading barrier protects it from readers of a previous call).
template <int kThreads, class V, class Combine>
__device__ __forceinline__ V block_reduce(V v, V identity, const Combine& combine, V* scratch) {
  static_assert(kThreads % kWarpSize == 0 && kThreads / kWarpSize <= kWarpSize, "one warp folds the warps");
  constexpr int kWarps = kThreads / kWarpSize;
  v = group_reduce<kWarpSize>(v, combine);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : identity;
    v = group_reduce<kWarpSize>(v, combine);
  }
  return v;
}

// block_reduce with the result given to every thread (through scratch[kThreads / 32]).
template <int kThreads, class V, class Combine>
__device__ __forceinline__ V block_allreduce(V v, V identity, const Combine& combine, V* scratch) {
  v = block_reduce<kThreads>(v, identity, combine, scratch);
  if (threadIdx.x == 0) scratch[kThreads / kWarpSize] = v;
  __syncthreads();
  return scratch[kThreads / kWarpSize];
}

// One reduction for the two ways a kernel may give a row to threads: G <= 32 lanes of a
// warp, or (G == kThreads) the whole block. The result is in the group's first lane
// (lanes_reduce) or in every lane (lanes_allreduce). Every thread of the block must call
// them; scratch (kThreads / 32 + 1 values of shared memory) is used by blocks only.
template <int G, int kThreads, class V, class Combine>
__device__ __forceinline__ V lanes_reduce(V v, V identity, const Combine& combine, V* scratch) {
  if constexpr (G <= kWarpSize) {
    return group_reduce<G>(v, combine);
  } else {
    static_assert(G == kThreads, "a row takes up to a warp, or the whole block");
    return block_reduce<kThreads>(v, identity, combine, scratch);
  }
}

template <int G, int kThreads, class V, class Combine>
__device__ __forceinline__ V lanes_allreduce(V v, V identity, const Combine& combine, V* scratch) {
  if constexpr (G <= kWarpSize) {
    return shfl(group_reduce<G>(v, combine), 0, G);
  } else {
    static_assert(G == kThreads, "a row takes up to a warp, or the whole block");
    return block_allreduce<kThreads>(v, identity, combine, scratch);
  }
}

// Tiles for strided ("column") layouts: thread t of a kThreads block is column
// x = t % 2^log_bx (adjacent threads read adjacent addresses, so loads coalesce) and tile
// row y = t / 2^log_bx, which splits the reduced dim. Folds the values of each column
// over its tile rows in a fixed tree and gives the total to every thread of the column.
// Every thread must call it; `smem` is shared memory for kThreads values.
template <int kThreads, class V, class Combine>
__device__ __forceinline__ V tile_column_allreduce(V v, int log_bx, const Combine& combine, V* smem) {
  const int bx = 1 << log_bx, y = threadIdx.x >> log_bx;
  __syncthreads();  // smem may still be read by a previous call
  smem[threadIdx.x] = v;
  for (int s = (kThreads >> log_bx) / 2; s > 0; s /= 2) {
    __syncthreads();
    if (y < s) smem[threadIdx.x] = combine(smem[threadIdx.x], smem[threadIdx.x + s * bx]);
  }
  __syncthreads();
  return smem[threadIdx.x & (bx - 1)];
}

// log2 of the width of a tile for `post` columns of `len` elements each, in a block of
// 2^log_threads threads: the smallest power of two >= post, up to a warp (so that a warp
// reads adjacent addresses), then wider while half the tile rows would still cover len
// (rows beyond len would idle).
inline int tile_log_width(int64_t post, int64_t len, int log_threads) {
  int log_bx = 0;
  while (log_bx < 5 && log_bx < log_threads && (int64_t{1} << log_bx) < post) ++log_bx;
  while (log_bx < log_threads && (int64_t{1} << (log_threads - log_bx - 1)) >= len) ++log_bx;
  return log_bx;
}

}  // namespace weft::cuda
