// CUDA kernels of the indexing family (contracts in kernels/index_ops_kernels.h).
//
// Bounds: the Tensor-level ops (kernels/index_ops.cpp) scan every index tensor with
// index_range_stub, on the index's own device; saved indices of a backward were scanned
// in its forward. On the GPU the scan is a deterministic two-stage reduction whose second
// stage records the first index out of range (the smallest position) as a device-side
// error (Note [Device-side errors], kernels/cuda/device_error_record.h): the host does not
// wait for it, and the error is raised at its next synchronisation. So the op's kernels
// run before anyone knows, and never dereference an index outside its range:
// index_select and gather read 0 for it; index_add and scatter_add only ever add into
// rows of their own range, which a bad index is in none of. Only one_hot without a class
// count waits for the scan, whose maximum it needs.
//
// Note [Deterministic index_add / scatter_add on CUDA]: no atomics. Every destination
// element has exactly one owning thread, which adds its contributions in index order,
// so the result is the CPU's to the bit (same additions in the same order; no products,
// hence no FMA contraction) and the same on every run.
//   index_add: a warp owns (outer row o, a range of destination rows, a block of
//   32 * kCols columns). The block stages the index in shared-memory tiles; each warp
//   tests 32 entries at once (ballot) for rows in its range and walks the hits in order,
//   each lane adding its columns. The row ranges are many when outer * column blocks is
//   small (embedding backward: one outer row), so the GPU stays full; the price is that
//   every warp scans the whole index, 32 entries per step.
//   scatter_add: a source fiber (all coordinates but `dim`) only writes the destination
//   fiber with the same coordinates, so a thread owns one fiber and walks it in order.
//   When fibers are few and long, up to 32 threads share a fiber, each owning a range of
//   destination rows (the index reads are then warp broadcasts).
// Both keep the running sum of the current destination in registers while consecutive
// hits land on it, and write it back when the row changes.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/device_error.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/index_ops_kernels.h"

namespace weft::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Threads one SM keeps resident on sm_80 / sm_90: the target when work is split to fill
// the GPU.
constexpr int64_t kResidentThreadsPerSm = 2048;

int64_t resident_threads() {
  int device = 0, sms = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&device));
  WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return int64_t{sms} * kResidentThreadsPerSm;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --- index_range -------------------------------------------------------------------
// Stage 1: each block folds a grid-stride slice into (min, max, first bad position);
// stage 2: one block folds the per-block partials. min / max are exact, so the order of
// folding does not matter; first_bad is a min over positions (INT64_MAX: none).

constexpr int kRangeThreads = 256;
constexpr int kRangeMaxBlocks = 1024;

struct RangePartial {
  int64_t min, max, first_bad;
};

__device__ __forceinline__ RangePartial fold(RangePartial a, RangePartial b) {
  return {a.min < b.min ? a.min : b.min, a.max > b.max ? a.max : b.max,
          a.first_bad < b.first_bad ? a.first_bad : b.first_bad};
}

// The fold of every thread's value, valid in thread 0. blockDim.x == kRangeThreads.
__device__ RangePartial block_fold(RangePartial r) {
  __shared__ RangePartial warp_parts[kRangeThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    RangePartial other{__shfl_down_sync(kFullMask, r.min, offset), __shfl_down_sync(kFullMask, r.max, offset),
                       __shfl_down_sync(kFullMask, r.first_bad, offset)};
    r = fold(r, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_parts[warp] = r;
  __syncthreads();
  if (warp == 0) {
    r = lane < kRangeThreads / 32 ? warp_parts[lane] : RangePartial{LLONG_MAX, LLONG_MIN, LLONG_MAX};
    for (int offset = 16; offset > 0; offset >>= 1) {
      RangePartial other{__shfl_down_sync(kFullMask, r.min, offset), __shfl_down_sync(kFullMask, r.max, offset),
                         __shfl_down_sync(kFullMask, r.first_bad, offset)};
      r = fold(r, other);
    }
  }
  return r;
}

__global__ void __launch_bounds__(kRangeThreads)
    index_range_partials(const int64_t* index, int64_t n, int64_t bound, RangePartial* partials) {
  RangePartial r{LLONG_MAX, LLONG_MIN, LLONG_MAX};
  for (int64_t i = blockIdx.x * int64_t{kRangeThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kRangeThreads) {
    const int64_t v = index[i];
    r.min = v < r.min ? v : r.min;
    r.max = v > r.max ? v : r.max;
    // i only grows, so the first bad position a thread sees is its smallest.
    if ((v < 0 || v >= bound) && r.first_bad == LLONG_MAX) r.first_bad = i;
  }
  r = block_fold(r);
  if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

// What the host reads back when it waits for the scan (one_hot): min, max, first bad
// position (-1: none) and its value.
struct RangeResult {
  int64_t min, max, first_bad, bad_value;
};

// Folds the partials; then either stores the result for the host (result != nullptr) or
// records the first bad index as a device-side error.
__global__ void __launch_bounds__(kRangeThreads)
    index_range_final(const RangePartial* partials, int count, const int64_t* index, int64_t bound,
                      RangeResult* result, DeviceErrorSink sink, const char* op) {
  RangePartial r{LLONG_MAX, LLONG_MIN, LLONG_MAX};
  for (int i = threadIdx.x; i < count; i += kRangeThreads) r = fold(r, partials[i]);
  r = block_fold(r);
  if (threadIdx.x != 0) return;
  const bool bad = r.first_bad != LLONG_MAX;
  if (result != nullptr)
    *result = RangeResult{r.min, r.max, bad ? r.first_bad : -1, bad ? index[r.first_bad] : 0};
  else if (bad)
    report_device_error(sink, DeviceErrorKind::IndexOutOfRange, op, index[r.first_bad], r.first_bad, bound);
}

IndexRange index_range_kernel(const Tensor& index, int64_t bound, const char* op, bool need_values) {
  const Device device = index.device();
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(device);
  const int64_t n = index.numel();
  WEFT_CHECK(n > 0, op, ": index_range_kernel needs a non-empty index (callers skip empty ones)");
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(n, kRangeThreads * 4), kRangeMaxBlocks));
  // Partials, then the result, in one int64 buffer (both are plain int64 records).
  static_assert(sizeof(RangePartial) == 3 * sizeof(int64_t) && sizeof(RangeResult) == 4 * sizeof(int64_t));
  Tensor scratch = empty({3 * int64_t{blocks} + 4}, TensorOptions(DType::Int64, device));
  auto* partials = static_cast<RangePartial*>(scratch.raw_data());
  auto* device_result = reinterpret_cast<RangeResult*>(static_cast<int64_t*>(scratch.raw_data()) + 3 * blocks);
  const auto* values = static_cast<const int64_t*>(index.raw_data());
  index_range_partials<<<blocks, kRangeThreads, 0, stream>>>(values, n, bound, partials);
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
  index_range_final<<<1, kRangeThreads, 0, stream>>>(partials, blocks, values, bound,
                                                     need_values ? device_result : nullptr,
                                                     device_error_sink(device), op);
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
  if (!need_values) {
    IndexRange deferred;
    deferred.deferred = true;
    return deferred;
  }
  RangeResult result;
  // The stream first, then the copy into pageable memory (copy_with_host in copy.cu says why).
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(&result, device_result, sizeof(RangeResult), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));  // the op needs the values now
  raise_pending_device_error();                     // a synchronisation like any other
  return IndexRange{result.min, result.max, result.first_bad, result.bad_value};
}

// --- index_select ------------------------------------------------------------------
// One output row (o, j) of `inner` elements per group of 2^row_shift threads: the row's
// source address costs one division, and the copy is coalesced along inner.

constexpr int kSelectThreads = 256;

template <class T>
__global__ void __launch_bounds__(kSelectThreads)
    index_select_rows(const T* x, const int64_t* index, T* out, int64_t rows, int64_t k, int64_t n, int64_t inner,
                      int row_shift) {
  const int threads_per_row = 1 << row_shift;
  const int rows_per_block = kSelectThreads >> row_shift;
  const int lane = threadIdx.x & (threads_per_row - 1);
  for (int64_t r = blockIdx.x * int64_t{rows_per_block} + (threadIdx.x >> row_shift); r < rows;
       r += int64_t{gridDim.x} * rows_per_block) {
    const int64_t o = r / k, j = r - o * k, row = index[j];
    T* to = out + r * inner;
    if (row < 0 || row >= n) {  // recorded by the range scan: read as zeros
      for (int64_t c = lane; c < inner; c += threads_per_row) to[c] = T(0);
      continue;
    }
    const T* from = x + (o * n + row) * inner;
    for (int64_t c = lane; c < inner; c += threads_per_row) to[c] = from[c];
  }
}

void index_select_kernel(const Tensor& x, const Tensor& index, const Tensor& out, int64_t outer, int64_t n,
                         int64_t inner) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  const int64_t k = index.numel(), rows = outer * k;
  int row_shift = 0;
  while ((int64_t{1} << row_shift) < inner && (1 << row_shift) < kSelectThreads) ++row_shift;
  const int blocks = grid_size(rows, kSelectThreads >> row_shift);
  dispatch_dtype(x.dtype(), DTypeSet::All, "index_select", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_select_rows<T><<<blocks, kSelectThreads, 0, stream>>>(
        static_cast<const T*>(x.raw_data()), static_cast<const int64_t*>(index.raw_data()),
        static_cast<T*>(out.raw_data()), rows, k, n, inner, row_shift);
    WEFT_CUDA_CHECK_LAUNCH("index_select", stream);
  });
}

// --- index_add (Note [Deterministic index_add / scatter_add on CUDA]) ---------------

constexpr int kAddThreads = 256;
constexpr int kAddWarps = kAddThreads / 32;
constexpr int kAddTile = 1024;  // int64 indices per shared-memory tile (8 KiB)

// Warp task = (o, part, column block), column block fastest. Destination rows of part p:
// [n * p / parts, n * (p + 1) / parts). Lane l owns columns cb * 32 * kCols + l + 32 * v.
template <class T, int kCols>
__global__ void __launch_bounds__(kAddThreads)
    index_add_owned(const T* src, const int64_t* index, T* out, int64_t outer, int64_t n, int64_t k, int64_t inner,
                    int64_t skip, int64_t parts, int64_t col_blocks) {
  __shared__ int64_t tile[kAddTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t tasks = outer * parts * col_blocks;
  // Every warp of a block runs the same loops (the tiles are shared), active or not.
  for (int64_t first = blockIdx.x * int64_t{kAddWarps}; first < tasks; first += int64_t{gridDim.x} * kAddWarps) {
    const bool active = first + warp < tasks;
    const int64_t task = active ? first + warp : 0;  // inactive warps only join the barriers
    const int64_t cb = task % col_blocks, part = (task / col_blocks) % parts, o = task / (col_blocks * parts);
    const int64_t row_lo = n * part / parts, row_hi = n * (part + 1) / parts;
    const int64_t col0 = cb * 32 * kCols + lane;
    T* out_o = out + o * n * inner;
    const T* src_o = src + o * k * inner;
    int64_t current = -1;  // destination row whose sums sit in acc
    T acc[kCols];
    for (int64_t j0 = 0; j0 < k; j0 += kAddTile) {
      const int len = static_cast<int>(k - j0 < kAddTile ? k - j0 : kAddTile);
      __syncthreads();  // the previous tile is consumed
      for (int t = threadIdx.x; t < len; t += kAddThreads) tile[t] = index[j0 + t];
      __syncthreads();
      if (!active) continue;
      for (int b0 = 0; b0 < len; b0 += 32) {
        const int b = b0 + lane;
        const int64_t row = b < len ? tile[b] : -1;
        unsigned hits = __ballot_sync(kFullMask, b < len && row >= row_lo && row < row_hi && row != skip);
        while (hits) {  // lowest bit first: index order
          const int bit = __ffs(hits) - 1;
          hits &= hits - 1;
          const int64_t r = tile[b0 + bit];
          if (r != current) {
#pragma unroll
            for (int v = 0; v < kCols; ++v) {
              const int64_t c = col0 + 32 * v;
              if (c < inner) {
                if (current >= 0) out_o[current * inner + c] = acc[v];
                acc[v] = out_o[r * inner + c];
              }
            }
            current = r;
          }
          const T* from = src_o + (j0 + b0 + bit) * inner;
#pragma unroll
          for (int v = 0; v < kCols; ++v) {
            const int64_t c = col0 + 32 * v;
            if (c < inner) acc[v] += from[c];
          }
        }
      }
    }
    if (active && current >= 0) {
#pragma unroll
      for (int v = 0; v < kCols; ++v) {
        const int64_t c = col0 + 32 * v;
        if (c < inner) out_o[current * inner + c] = acc[v];
      }
    }
  }
}

void index_add_kernel(const Tensor& src, const Tensor& index, const Tensor& out, int64_t outer, int64_t n,
                      int64_t inner, int64_t skip) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  const int64_t k = index.numel();
  // Wide rows: four columns per lane, so a warp's index scan serves 128 columns.
  const int cols = inner > 32 ? 4 : 1;
  const int64_t col_blocks = ceil_div(inner, 32 * cols);
  // Enough row ranges to keep every SM full of warps; no more than rows or hits exist.
  const int64_t target_warps = resident_threads() / 32;
  const int64_t most_parts = std::max<int64_t>(1, std::min(n, k));
  const int64_t parts = std::clamp<int64_t>(ceil_div(target_warps, outer * col_blocks), 1, most_parts);
  const int64_t tasks = outer * parts * col_blocks;
  const int blocks = grid_size(tasks, kAddWarps);
  dispatch_dtype(out.dtype(), DTypeSet::Numeric, "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src.raw_data());
    const int64_t* idx = static_cast<const int64_t*>(index.raw_data());
    T* d = static_cast<T*>(out.raw_data());
    if (cols == 4)
      index_add_owned<T, 4><<<blocks, kAddThreads, 0, stream>>>(s, idx, d, outer, n, k, inner, skip, parts, col_blocks);
    else
      index_add_owned<T, 1><<<blocks, kAddThreads, 0, stream>>>(s, idx, d, outer, n, k, inner, skip, parts, col_blocks);
    WEFT_CUDA_CHECK_LAUNCH("index_add", stream);
  });
}

// --- gather / scatter_add ----------------------------------------------------------

// t (detached) read with `sizes` and t's own strides, except stride 0 along `zero_dim`
// (-1: none): the element offsets of positions of an index-shaped iteration space.
Tensor strided_as(const Tensor& t, const Shape& sizes, int64_t zero_dim) {
  Shape strides = t.strides();
  if (zero_dim >= 0) strides[zero_dim] = 0;
  return t.detach().as_strided(sizes, strides, t.offset());
}

// Position i of the index's shape: out[i] = x[x_base(i) + index[i] * step], where
// x_base(i) is x's byte offset with the `dim` coordinate left out (index and out are
// contiguous and share that shape). An index outside [0, size) reads 0.
template <class T>
__global__ void __launch_bounds__(kBlockSize) gather_elements(StridedIndexer<1> x_base, const int64_t* index, T* out,
                                                              int64_t numel, int64_t step, int64_t size) {
  for (int64_t i = blockIdx.x * int64_t{kBlockSize} + threadIdx.x; i < numel; i += int64_t{gridDim.x} * kBlockSize) {
    const int64_t at = index[i];
    out[i] = at >= 0 && at < size ? *reinterpret_cast<const T*>(x_base.pointer(0, i) + at * step) : T(0);
  }
}

void gather_kernel(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  const Tensor x_base = strided_as(x, index.shape(), dim);
  const StridedIndexer<1> ix = make_indexer<1>(index.shape(), {&x_base});
  const int64_t numel = out.numel();
  dispatch_dtype(x.dtype(), DTypeSet::All, "gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_elements<T><<<grid_size(numel), kBlockSize, 0, stream>>>(
        ix, static_cast<const int64_t*>(index.raw_data()), static_cast<T*>(out.raw_data()), numel,
        x.strides()[dim] * static_cast<int64_t>(sizeof(T)), x.shape()[dim]);
    WEFT_CUDA_CHECK_LAUNCH("gather", stream);
  });
}

constexpr int kScatterThreads = 256;
constexpr int64_t kMaxScatterParts = 32;  // threads sharing one fiber (one warp at most)
constexpr int64_t kMinScatterSplitLength = 64;  // shorter fibers are not worth splitting

// Thread t owns fiber t / parts and, within it, destination rows
// [rows * p / parts, rows * (p + 1) / parts) for p = t % parts. Steps are in index
// elements (index) and bytes (src, out) along `dim`.
template <class T>
__global__ void __launch_bounds__(kScatterThreads)
    scatter_add_owned(StridedIndexer<3> ix, int64_t fibers, int64_t parts, int64_t len, int64_t rows,
                      int64_t index_step, int64_t src_step, int64_t out_step) {
  for (int64_t t = blockIdx.x * int64_t{kScatterThreads} + threadIdx.x; t < fibers * parts;
       t += int64_t{gridDim.x} * kScatterThreads) {
    const int64_t f = t / parts, part = t - f * parts;
    const int64_t row_lo = rows * part / parts, row_hi = rows * (part + 1) / parts;
    const int64_t* index = reinterpret_cast<const int64_t*>(ix.pointer(0, f));
    const char* from = ix.pointer(1, f);
    char* to = ix.pointer(2, f);
    int64_t current = -1;  // destination row whose sum sits in acc
    T acc{};
    for (int64_t j = 0; j < len; ++j) {
      const int64_t r = index[j * index_step];
      if (r < row_lo || r >= row_hi) continue;
      const T v = *reinterpret_cast<const T*>(from + j * src_step);
      if (r != current) {
        if (current >= 0) *reinterpret_cast<T*>(to + current * out_step) = acc;
        acc = *reinterpret_cast<const T*>(to + r * out_step);
        current = r;
      }
      acc += v;
    }
    if (current >= 0) *reinterpret_cast<T*>(to + current * out_step) = acc;
  }
}

void scatter_add_kernel(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  const int64_t len = index.shape()[dim], fibers = index.numel() / len, rows = out.shape()[dim];
  // Fibers: the index's shape with `dim` collapsed to 1; every operand keeps its strides
  // (index.size(d) <= out.size(d), src.size(d) for d != dim, so the views stay inside).
  Shape fiber_shape = index.shape();
  fiber_shape[dim] = 1;
  const Tensor index_f = strided_as(index, fiber_shape, -1), src_f = strided_as(src, fiber_shape, -1),
               out_f = strided_as(out, fiber_shape, -1);
  const StridedIndexer<3> ix = make_indexer<3>(fiber_shape, {&index_f, &src_f, &out_f});
  int64_t parts = 1;
  const int64_t target = resident_threads();
  if (len >= kMinScatterSplitLength && fibers < target)
    parts = std::clamp<int64_t>(target / fibers, 1, std::max<int64_t>(1, std::min(rows, kMaxScatterParts)));
  const int blocks = grid_size(fibers * parts, kScatterThreads);
  dispatch_dtype(out.dtype(), DTypeSet::Numeric, "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t size = static_cast<int64_t>(sizeof(T));
    scatter_add_owned<T><<<blocks, kScatterThreads, 0, stream>>>(ix, fibers, parts, len, rows, index.strides()[dim],
                                                                 src.strides()[dim] * size, out.strides()[dim] * size);
    WEFT_CUDA_CHECK_LAUNCH("scatter_add", stream);
  });
}

}  // namespace

void register_index_kernels() {
  index_range_stub.set(DeviceType::CUDA, &index_range_kernel);
  index_select_stub.set(DeviceType::CUDA, &index_select_kernel);
  index_add_stub.set(DeviceType::CUDA, &index_add_kernel);
  gather_stub.set(DeviceType::CUDA, &gather_kernel);
  scatter_add_stub.set(DeviceType::CUDA, &scatter_add_kernel);
}

}  // namespace weft::cuda
