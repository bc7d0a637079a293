// CUDA reductions over [outer, inner, post] (contract: kernels/reduce_kernels.h; the
// semantics are those of kernels/cpu/reduce.cpp: integers sum in int64 and floats in
// float64, NaN propagates through max / min and counts as the extremum for argmax /
// argmin, ties give the first index, Var is two passes).
//
// Note [Deterministic GPU reductions]: each output is reduced by one group of threads
// (a warp's lanes or a block), or, for long rows and columns, by a fixed number of such
// groups over consecutive segments whose partial results a second kernel folds in
// segment order. The segment count, the assignment of elements to lanes and the trees
// that combine lanes (kernels/cuda/group_reduce.cuh) depend only on (outer, inner, post),
// never on timing, the GPU model or the alignment of the data, and nothing uses atomics:
// the results are bitwise reproducible. They are not bitwise those of the CPU (another
// summation order), but are as accurate (the same accumulator types).
//
// Rows (post == 1) are read in 16-byte packs: lane l of a group takes packs l, l + lanes,
// ... of its segment, so a warp reads whole 128-byte lines with a quarter of the load
// instructions, four packs in flight per lane. A misaligned row (inner not a multiple of
// the pack) reads the same packs element by element, so the order never changes.
// Columns (post > 1) are tiles of adjacent outputs (at least min(post, 32) wide, wider when
// the reduced dim is short) by 256 / width rows of the reduced dim: a warp reads adjacent
// addresses, and the tile rows are folded in shared memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/group_reduce.cuh"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/reduce_kernels.h"

namespace weft::cuda {

namespace {

constexpr int kLogThreads = 8;
constexpr int kThreads = 1 << kLogThreads;
constexpr int kWarps = kThreads / kWarpSize;
// A row segment is 64 KiB of input: enough work per block to amortise its start and its
// partial, small enough that a 64 MiB row spreads over 1024 blocks (several per SM).
constexpr int64_t kSegmentBytes = 64 * 1024;
// Long rows / columns are split until about this many blocks run, for any GPU model (the
// split must not depend on the device, or results would).
constexpr int64_t kTargetBlocks = 2048;
// Each thread of a column tile takes at least this many elements of its column segment.
constexpr int64_t kMinColumnRun = 16;
// Grid-stride loops beyond this many blocks (results do not depend on the grid).
constexpr int64_t kMaxGrid = 1 << 16;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int grid_for(int64_t blocks) { return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxGrid)); }

// Accumulator type: float64 for floating inputs, int64 for integers (as on the CPU).
template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <class T>
__device__ __forceinline__ bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

template <class T>
__host__ __device__ constexpr T lowest_value() {
  if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}

template <class T>
__host__ __device__ constexpr T highest_value() {
  if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}

// --- reducers -------------------------------------------------------------------------
// A reducer maps an element (value, index along inner, per-output context) to a Value
// and combines Values; identity() is the Value of no element. A finisher stores the
// Value of output `o`.

struct NoContext {};

// Sum and Mean, and the first pass of Var.
template <class T>
struct SumReducer {
  using Elem = T;
  using Value = Acc<T>;
  using Context = NoContext;
  __device__ Value identity() const { return Value(0); }
  __device__ Context context(int64_t) const { return {}; }
  __device__ Value element(T v, int64_t, Context) const { return static_cast<Value>(v); }
  __device__ Value combine(Value a, Value b) const { return a + b; }
};

// The second pass of Var: squared deviations from each output's mean (first pass).
template <class T>
struct SquaredDeviationReducer {
  using Elem = T;
  using Value = double;
  using Context = double;
  const double* mean;
  __device__ Value identity() const { return 0.0; }
  __device__ Context context(int64_t o) const { return mean[o]; }
  __device__ Value element(T v, int64_t, Context m) const {
    double d = static_cast<double>(v) - m;
    return d * d;
  }
  __device__ Value combine(Value a, Value b) const { return a + b; }
};

// Max (kMax) / Min: b replaces a when it is larger (smaller) or NaN, so that a NaN,
// once taken, stays.
template <class T, bool kMax>
struct ExtremumReducer {
  using Elem = T;
  using Value = T;
  using Context = NoContext;
  __device__ Value identity() const { return kMax ? lowest_value<T>() : highest_value<T>(); }
  __device__ Context context(int64_t) const { return {}; }
  __device__ Value element(T v, int64_t, Context) const { return v; }
  __device__ Value combine(Value a, Value b) const {
    return ((kMax ? b > a : b < a) || is_nan(b)) ? b : a;
  }
};

template <class T>
struct Indexed {
  T value;
  int64_t index;
};

template <class T>
__device__ __forceinline__ Indexed<T> shfl_down(Indexed<T> v, unsigned delta, int width) {
  return {cuda::shfl_down(v.value, delta, width), cuda::shfl_down(v.index, delta, width)};
}

// ArgMax (kMax) / ArgMin. A value beats another when strictly larger (smaller) or the
// first NaN; between equal values (or two NaN) the smaller index wins. That selection is
// exact and independent of the combining order: the first index of the extremum.
template <class T, bool kMax>
struct ArgReducer {
  using Elem = T;
  using Value = Indexed<T>;
  using Context = NoContext;
  __device__ static bool beats(T x, T y) { return (kMax ? x > y : x < y) || (is_nan(x) && !is_nan(y)); }
  __device__ Value identity() const {
    return {kMax ? lowest_value<T>() : highest_value<T>(), std::numeric_limits<int64_t>::max()};
  }
  __device__ Context context(int64_t) const { return {}; }
  __device__ Value element(T v, int64_t i, Context) const { return {v, i}; }
  __device__ Value combine(Value a, Value b) const {
    bool take_b = beats(b.value, a.value) || (!beats(a.value, b.value) && b.index < a.index);
    return take_b ? b : a;
  }
};

template <class Out, class V>
struct StoreOut {  // Sum, Max, Min
  Out* dst;
  __device__ void operator()(int64_t o, V v) const { dst[o] = static_cast<Out>(v); }
};

template <class Out, class V>
struct MeanOut {  // Mean, and the first pass of Var (into a float64 buffer)
  Out* dst;
  int64_t inner;
  __device__ void operator()(int64_t o, V v) const {
    dst[o] = static_cast<Out>(static_cast<double>(v) / static_cast<double>(inner));
  }
};

template <class T>
struct VarOut {
  T* dst;
  double divisor;  // max(0, inner - correction): 0 gives inf or NaN, as on the CPU
  __device__ void operator()(int64_t o, double v) const { dst[o] = static_cast<T>(v / divisor); }
};

template <class T>
struct ArgOut {
  int64_t* index;
  T* values;  // null: not asked for
  __device__ void operator()(int64_t o, Indexed<T> v) const {
    index[o] = v.index;
    if (values) values[o] = v.value;
  }
};

// --- one run of a row ------------------------------------------------------------------

template <class T>
struct alignas(16) Pack {
  T v[16 / sizeof(T)];
};

template <class R>
__device__ __forceinline__ typename R::Value fold_pack(const R& r, const Pack<typename R::Elem>& pack,
                                                       int64_t index, typename R::Context ctx,
                                                       typename R::Value acc) {
#pragma unroll
  for (int j = 0; j < static_cast<int>(sizeof(pack.v) / sizeof(pack.v[0])); ++j)
    acc = r.combine(acc, r.element(pack.v[j], index + j, ctx));
  return acc;
}

// Folds the `len` elements at p (inner indices first_index, first_index + 1, ...) into
// acc as lane `lane` of `lanes`: the lane takes packs lane, lane + lanes, ... in order,
// then the elements after the last whole pack (fewer than a pack) go to lanes 0, 1, ....
// Which lane takes which element depends only on len, never on p's alignment.
template <class R>
__device__ __forceinline__ typename R::Value fold_run(const R& r, const typename R::Elem* __restrict__ p,
                                                      int64_t len, int64_t first_index, typename R::Context ctx,
                                                      int lane, int lanes, typename R::Value acc) {
  using T = typename R::Elem;
  constexpr int kPack = 16 / sizeof(T);
  const int64_t packs = len / kPack;
  int64_t k = lane;
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    const Pack<T>* pp = reinterpret_cast<const Pack<T>*>(p);
    // Four independent 16-byte loads in flight per lane before their values are used.
    for (; k + 3 * int64_t{lanes} < packs; k += 4 * int64_t{lanes}) {
      Pack<T> a = pp[k], b = pp[k + lanes], c = pp[k + 2 * lanes], d = pp[k + 3 * lanes];
      acc = fold_pack(r, a, first_index + k * kPack, ctx, acc);
      acc = fold_pack(r, b, first_index + (k + lanes) * kPack, ctx, acc);
      acc = fold_pack(r, c, first_index + (k + 2 * lanes) * kPack, ctx, acc);
      acc = fold_pack(r, d, first_index + (k + 3 * lanes) * kPack, ctx, acc);
    }
    for (; k < packs; k += lanes) acc = fold_pack(r, pp[k], first_index + k * kPack, ctx, acc);
  } else {
    for (; k < packs; k += lanes) {
      const T* q = p + k * kPack;
#pragma unroll
      for (int j = 0; j < kPack; ++j) acc = r.combine(acc, r.element(q[j], first_index + k * kPack + j, ctx));
    }
  }
  for (int64_t i = packs * kPack + lane; i < len; i += lanes) acc = r.combine(acc, r.element(p[i], first_index + i, ctx));
  return acc;
}

// --- kernels ---------------------------------------------------------------------------

// Rows: G lanes (G <= 32) or the whole block (G == kThreads) per unit; unit u is segment
// u % splits of row u / splits, of seg_len elements (the last one shorter). With one
// segment per row the finisher stores the result; otherwise the unit's Value goes to
// partials[u] for fold_kernel.
template <class R, class F, int G>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(R r, F finish, typename R::Value* partials, const typename R::Elem* __restrict__ in, int64_t outer,
                int64_t inner, int64_t seg_len, int64_t splits) {
  using V = typename R::Value;
  constexpr int kGroups = kThreads / G;
  __shared__ V scratch[kWarps + 1];
  const int lane = threadIdx.x % G;
  const int64_t units = outer * splits;
  auto combine = [&r](V a, V b) { return r.combine(a, b); };
  // `base` is the same for the whole block, so every thread runs the same iterations and
  // reaches the shuffles and barriers of lanes_reduce.
  for (int64_t base = blockIdx.x * int64_t{kGroups}; base < units; base += gridDim.x * int64_t{kGroups}) {
    const int64_t unit = base + threadIdx.x / G;
    const int64_t row = unit / splits, start = (unit % splits) * seg_len;
    V acc = r.identity();
    if (unit < units) {
      acc = fold_run(r, in + row * inner + start, std::min(seg_len, inner - start), start, r.context(row), lane, G,
                     acc);
    }
    acc = lanes_reduce<G, kThreads>(acc, r.identity(), combine, scratch);
    if (unit < units && lane == 0) {
      if (splits == 1) finish(row, acc);
      else partials[unit] = acc;
    }
  }
}

// Columns: tiles of 2^log_bx adjacent outputs of one outer index; unit u is segment
// u % splits (of seg_len elements of the reduced dim) of tile u / splits. Tile row y
// takes the elements y, y + by, ... of the segment.
template <class R, class F>
__global__ void __launch_bounds__(kThreads)
    columns_kernel(R r, F finish, typename R::Value* partials, const typename R::Elem* __restrict__ in, int64_t outer,
                   int64_t inner, int64_t post, int log_bx, int64_t seg_len, int64_t splits) {
  using V = typename R::Value;
  __shared__ V smem[kThreads];
  const int bx = 1 << log_bx, by = kThreads >> log_bx;
  const int x = threadIdx.x & (bx - 1), y = threadIdx.x >> log_bx;
  const int64_t tiles = ceil_div(post, bx);
  const int64_t units = outer * tiles * splits;
  auto combine = [&r](V a, V b) { return r.combine(a, b); };
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int64_t split = unit % splits, tile = unit / splits % tiles, o = unit / splits / tiles;
    const int64_t p = tile * bx + x;
    const int64_t out = o * post + p;
    const int64_t begin = split * seg_len, end = std::min(inner, begin + seg_len);
    V acc = r.identity();
    if (p < post) {
      const typename R::Context ctx = r.context(out);
      const typename R::Elem* q = in + (o * inner + begin + y) * post + p;
      const int64_t step = int64_t{by} * post;
#pragma unroll 4
      for (int64_t i = begin + y; i < end; i += by, q += step) acc = r.combine(acc, r.element(*q, i, ctx));
    }
    acc = tile_column_allreduce<kThreads>(acc, log_bx, combine, smem);
    if (p < post && y == 0) {
      if (splits == 1) finish(out, acc);
      else partials[out * splits + split] = acc;
    }
  }
}

// Folds each output's `splits` partials in a fixed order: a warp per output, lane l
// taking partials l, l + 32, ... then the warp's tree.
template <class R, class F>
__global__ void __launch_bounds__(kThreads)
    fold_kernel(R r, F finish, const typename R::Value* __restrict__ partials, int64_t outputs, int64_t splits) {
  using V = typename R::Value;
  const int lane = threadIdx.x % kWarpSize;
  auto combine = [&r](V a, V b) { return r.combine(a, b); };
  for (int64_t base = blockIdx.x * int64_t{kWarps}; base < outputs; base += gridDim.x * int64_t{kWarps}) {
    const int64_t out = base + threadIdx.x / kWarpSize;
    V acc = r.identity();
    if (out < outputs)
      for (int64_t k = lane; k < splits; k += kWarpSize) acc = r.combine(acc, partials[out * splits + k]);
    acc = group_reduce<kWarpSize>(acc, combine);
    if (out < outputs && lane == 0) finish(out, acc);
  }
}

// --- launch ----------------------------------------------------------------------------

struct Geometry {
  int64_t outer, inner, post;
  Device device;
  cudaStream_t stream;
  const char* op;  // the op's name, for launch failures
};

// Device memory for `count` partial Values, from the caching allocator (stream-ordered:
// freed when this returns, reused only by work queued after the kernels that use it).
template <class V>
Tensor partial_buffer(int64_t count, Device device) {
  return empty({count * static_cast<int64_t>(sizeof(V))}, TensorOptions(DType::UInt8, device));
}

template <class R, class F>
void launch_fold(const R& r, const F& finish, const typename R::Value* partials, int64_t outputs, int64_t splits,
                 const Geometry& g) {
  fold_kernel<R, F><<<grid_for(ceil_div(outputs, kWarps)), kThreads, 0, g.stream>>>(r, finish, partials, outputs,
                                                                                    splits);
  WEFT_CUDA_CHECK_LAUNCH(g.op, g.stream);
}

template <class R, class F>
void reduce_rows(const R& r, const F& finish, const typename R::Elem* in, const Geometry& g) {
  using T = typename R::Elem;
  using V = typename R::Value;
  if (g.inner <= 16) {
    rows_kernel<R, F, 4><<<grid_for(ceil_div(g.outer, kThreads / 4)), kThreads, 0, g.stream>>>(r, finish, nullptr, in,
                                                                                             g.outer, g.inner, g.inner, 1);
    WEFT_CUDA_CHECK_LAUNCH(g.op, g.stream);
    return;
  }
  if (g.inner <= 1024) {
    rows_kernel<R, F, kWarpSize><<<grid_for(ceil_div(g.outer, kThreads / kWarpSize)), kThreads, 0, g.stream>>>(
        r, finish, nullptr, in, g.outer, g.inner, g.inner, 1);
    WEFT_CUDA_CHECK_LAUNCH(g.op, g.stream);
    return;
  }
  // A block per segment. Segments are whole multiples of 16 elements, so every segment
  // of an aligned row starts on a 16-byte boundary.
  const int64_t max_segment = kSegmentBytes / static_cast<int64_t>(sizeof(T));
  const int64_t splits_wanted =
      std::min(ceil_div(g.inner, max_segment), std::max<int64_t>(1, ceil_div(kTargetBlocks, g.outer)));
  const int64_t seg_len = ceil_div(ceil_div(g.inner, splits_wanted), 16) * 16;
  const int64_t splits = ceil_div(g.inner, seg_len);
  Tensor partials = splits > 1 ? partial_buffer<V>(g.outer * splits, g.device) : Tensor();
  V* partial_data = splits > 1 ? static_cast<V*>(partials.raw_data()) : nullptr;
  rows_kernel<R, F, kThreads><<<grid_for(g.outer * splits), kThreads, 0, g.stream>>>(r, finish, partial_data, in,
                                                                                     g.outer, g.inner, seg_len, splits);
  WEFT_CUDA_CHECK_LAUNCH(g.op, g.stream);
  if (splits > 1) launch_fold(r, finish, partial_data, g.outer, splits, g);
}

template <class R, class F>
void reduce_columns(const R& r, const F& finish, const typename R::Elem* in, const Geometry& g) {
  using V = typename R::Value;
  const int log_bx = tile_log_width(g.post, g.inner, kLogThreads);
  const int64_t by = kThreads >> log_bx;
  const int64_t tiles = g.outer * ceil_div(g.post, int64_t{1} << log_bx);
  // Split the reduced dim only while the tiles alone leave the GPU idle, and only into
  // segments that give every tile row at least kMinColumnRun elements.
  const int64_t splits_wanted = std::min(std::max<int64_t>(1, g.inner / (by * kMinColumnRun)),
                                         std::max<int64_t>(1, ceil_div(kTargetBlocks, tiles)));
  const int64_t seg_len = std::max<int64_t>(1, ceil_div(g.inner, splits_wanted));
  const int64_t splits = std::max<int64_t>(1, ceil_div(g.inner, seg_len));
  const int64_t outputs = g.outer * g.post;
  Tensor partials = splits > 1 ? partial_buffer<V>(outputs * splits, g.device) : Tensor();
  V* partial_data = splits > 1 ? static_cast<V*>(partials.raw_data()) : nullptr;
  columns_kernel<R, F><<<grid_for(tiles * splits), kThreads, 0, g.stream>>>(r, finish, partial_data, in, g.outer,
                                                                             g.inner, g.post, log_bx, seg_len, splits);
  WEFT_CUDA_CHECK_LAUNCH(g.op, g.stream);
  if (splits > 1) launch_fold(r, finish, partial_data, outputs, splits, g);
}

template <class R, class F>
void run(const R& r, const F& finish, const typename R::Elem* in, const Geometry& g) {
  if (g.post == 1) reduce_rows(r, finish, in, g);
  else reduce_columns(r, finish, in, g);
}

template <class T>
void reduce_typed(ReduceOp op, const T* in, const Geometry& g, const Tensor& out, const Tensor& values,
                  double correction) {
  T* vals = values.defined() ? static_cast<T*>(values.raw_data()) : nullptr;
  switch (op) {
    case ReduceOp::Sum:
      run(SumReducer<T>{}, StoreOut<T, Acc<T>>{static_cast<T*>(out.raw_data())}, in, g);
      return;
    case ReduceOp::Max:
      run(ExtremumReducer<T, true>{}, StoreOut<T, T>{static_cast<T*>(out.raw_data())}, in, g);
      return;
    case ReduceOp::Min:
      run(ExtremumReducer<T, false>{}, StoreOut<T, T>{static_cast<T*>(out.raw_data())}, in, g);
      return;
    case ReduceOp::ArgMax:
      run(ArgReducer<T, true>{}, ArgOut<T>{static_cast<int64_t*>(out.raw_data()), vals}, in, g);
      return;
    case ReduceOp::ArgMin:
      run(ArgReducer<T, false>{}, ArgOut<T>{static_cast<int64_t*>(out.raw_data()), vals}, in, g);
      return;
    case ReduceOp::Mean:
    case ReduceOp::Var:
      break;
  }
  // Mean and Var exist for floating dtypes only (the Tensor-level ops check it).
  if constexpr (std::is_floating_point_v<T>) {
    if (op == ReduceOp::Mean) {
      run(SumReducer<T>{}, MeanOut<T, double>{static_cast<T*>(out.raw_data()), g.inner}, in, g);
      return;
    }
    // Two passes, as on the CPU (no cancellation, unlike E[x^2] - E[x]^2): the means
    // into a float64 buffer, then the squared deviations from them.
    Tensor means = empty({g.outer * g.post}, TensorOptions(DType::Float64, g.device));
    double* mean_data = static_cast<double*>(means.raw_data());
    run(SumReducer<T>{}, MeanOut<double, double>{mean_data, g.inner}, in, g);
    const double divisor = std::max(0.0, static_cast<double>(g.inner) - correction);
    run(SquaredDeviationReducer<T>{mean_data}, VarOut<T>{static_cast<T*>(out.raw_data()), divisor}, in, g);
  } else {
    WEFT_FAIL("reduce: mean and var need a floating dtype, got ", dtype_of<T>);
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::ArgMax: return "argmax";
    case ReduceOp::ArgMin: return "argmin";
    case ReduceOp::Var: return "var";
  }
  return "reduce";
}

void reduce_kernel(ReduceOp op, const Tensor& in, int64_t outer, int64_t inner, int64_t post, const Tensor& out,
                   const Tensor& values, double correction) {
  if (outer == 0 || post == 0) return;  // no outputs (the split math below divides by them)
  DeviceGuard guard(out.device());
  const Geometry g{outer, inner, post, out.device(), stream_of(out.device()), reduce_op_name(op)};
  dispatch_dtype(in.dtype(), DTypeSet::Numeric, "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The Numeric set still instantiates bool; the Tensor-level ops refuse bool inputs.
    if constexpr (std::is_same_v<T, bool>) WEFT_FAIL("reduce: not defined for bool tensors");
    else reduce_typed<T>(op, static_cast<const T*>(in.raw_data()), g, out, values, correction);
  });
}

}  // namespace

void register_reduce_kernels() { reduce_stub.set(DeviceType::CUDA, &reduce_kernel); }

}  // namespace weft::cuda
