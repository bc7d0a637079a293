// CPU reductions over [outer, inner, post] (contract: kernels/reduce_kernels.h).
//
// Note [Deterministic blocked rows]: a row (post == 1) is cut into blocks of kBlock
// elements; each block is reduced with kLanes independent accumulators (so the compiler
// can vectorise the loop) and the block results are folded in block order. That order
// depends only on the row's length, never on the thread count: many rows run in
// parallel row by row, a few long rows run in parallel block by block (partials into a
// buffer, folded after), and both give bit-identical results.
//
// Columns (post > 1) are reduced kColumns at a time: each step reads kColumns
// neighbouring elements of one inner index, so memory is read in order and the loop over
// columns vectorises. Each column is reduced sequentially along inner; blocks of columns
// run in parallel.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reduce_kernels.h"

namespace weft {

namespace {

constexpr int64_t kBlock = 8192;
constexpr int kLanes = 8;
constexpr int kColumns = 1024;

// Accumulator type: float64 for floating inputs, int64 for integers.
template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

// The running extremum after seeing v: v when it is larger (kMax) / smaller, or NaN, so
// that a NaN, once taken, stays (v > NaN is false).
template <bool kMax, class T>
T take(T best, T v) {
  bool pick = (kMax ? v > best : v < best) | is_nan(v);
  return pick ? v : best;
}

// Whether v replaces best for argmax (kMax) / argmin: strictly better, or the first NaN.
template <bool kMax, class T>
bool beats(T v, T best) {
  return (kMax ? v > best : v < best) || (is_nan(v) && !is_nan(best));
}

template <class T>
struct Indexed {
  T value;
  int64_t index;
};

// --- one contiguous run ---------------------------------------------------------------

template <class A>
A fold_lanes(const A (&lane)[kLanes]) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <class T>
Acc<T> sum_run(const T* p, int64_t n) {
  Acc<T> lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<Acc<T>>(p[i + l]);
  for (int l = 0; i < n; ++i, ++l) lane[l] += static_cast<Acc<T>>(p[i]);
  return fold_lanes(lane);
}

template <class T>
double squared_deviation_run(const T* p, int64_t n, double mean) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      double d = static_cast<double>(p[i + l]) - mean;
      lane[l] += d * d;
    }
  for (int l = 0; i < n; ++i, ++l) {
    double d = static_cast<double>(p[i]) - mean;
    lane[l] += d * d;
  }
  return fold_lanes(lane);
}

// Extremum of n >= 1 elements, NaN if any is NaN, in one scan: the lanes use the
// compare-and-select that vectorises (and skips NaN), while a running sum per lane turns
// NaN if any element is NaN. Only then (or when +inf meets -inf in that sum) is the run
// scanned again with the NaN-propagating rule.
template <bool kMax, class T>
T extremum_run(const T* p, int64_t n) {
  T lane[kLanes], check[kLanes];
  for (int l = 0; l < kLanes; ++l) lane[l] = p[0], check[l] = 0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      T v = p[i + l];
      lane[l] = (kMax ? v > lane[l] : v < lane[l]) ? v : lane[l];
      check[l] += v;
    }
  T best = lane[0];
  for (int l = 1; l < kLanes; ++l) best = (kMax ? lane[l] > best : lane[l] < best) ? lane[l] : best;
  for (; i < n; ++i) best = take<kMax>(best, p[i]);
  if constexpr (std::is_floating_point_v<T>) {
    T sum = 0;
    for (int l = 0; l < kLanes; ++l) sum += check[l];
    if (is_nan(sum) || is_nan(best)) {
      best = p[0];
      for (int64_t k = 1; k < n; ++k) best = take<kMax>(best, p[k]);
    }
  }
  return best;
}

// First extremum of n >= 1 elements, indices starting at `base`: the extremum, then the
// first element equal to it (a NaN matches a NaN). The block is cache-resident for the
// second scan.
template <bool kMax, class T>
Indexed<T> arg_run(const T* p, int64_t n, int64_t base) {
  T best = extremum_run<kMax>(p, n);
  int64_t i = 0;
  if (is_nan(best)) {
    while (!is_nan(p[i])) ++i;
  } else {
    while (p[i] != best) ++i;
  }
  return {best, base + i};
}

// --- rows (post == 1) -------------------------------------------------------------------

// Reduces each of `outer` rows of `inner` elements (Note [Deterministic blocked rows]):
// part(o, begin, len) reduces row o's elements [begin, begin + len), fold(a, b) combines
// consecutive blocks' results, finish(o, result) stores row o's result. An empty row is
// one empty block.
template <class P, class Part, class Fold, class Finish>
void reduce_blocked(int64_t outer, int64_t inner, const Part& part, const Fold& fold, const Finish& finish) {
  const int64_t blocks = std::max<int64_t>(1, (inner + kBlock - 1) / kBlock);
  auto reduce_row = [&](int64_t o) {
    P acc = part(o, 0, std::min(inner, kBlock));
    for (int64_t b = 1; b < blocks; ++b) acc = fold(acc, part(o, b * kBlock, std::min(kBlock, inner - b * kBlock)));
    finish(o, acc);
  };
  if (blocks == 1 || outer >= 4 * num_threads()) {
    int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(inner, 1));
    cpu::parallel_for(0, outer, grain, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) reduce_row(o);
    });
    return;
  }
  std::vector<P> partials(outer * blocks);
  cpu::parallel_for(0, outer * blocks, std::max<int64_t>(1, cpu::kGrain / kBlock), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      int64_t o = k / blocks, b = k % blocks;
      partials[k] = part(o, b * kBlock, std::min(kBlock, inner - b * kBlock));
    }
  });
  for (int64_t o = 0; o < outer; ++o) {
    P acc = partials[o * blocks];
    for (int64_t b = 1; b < blocks; ++b) acc = fold(acc, partials[o * blocks + b]);
    finish(o, acc);
  }
}

template <bool kMax, class T>
void arg_rows(const T* in, int64_t outer, int64_t inner, int64_t* dst, T* values) {
  reduce_blocked<Indexed<T>>(
      outer, inner, [&](int64_t o, int64_t b, int64_t n) { return arg_run<kMax>(in + o * inner + b, n, b); },
      // Blocks fold left to right and a later block wins only when strictly better, so
      // ties keep the first index.
      [](Indexed<T> a, Indexed<T> b) { return beats<kMax>(b.value, a.value) ? b : a; },
      [&](int64_t o, Indexed<T> r) {
        dst[o] = r.index;
        if (values) values[o] = r.value;
      });
}

template <class T>
void reduce_rows(ReduceOp op, const T* in, int64_t outer, int64_t inner, const Tensor& out, T* values,
                 double correction) {
  auto row = [&](int64_t o, int64_t begin) { return in + o * inner + begin; };
  auto add = [](auto a, auto b) { return a + b; };
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: {
      T* dst = static_cast<T*>(out.raw_data());
      reduce_blocked<Acc<T>>(
          outer, inner, [&](int64_t o, int64_t b, int64_t n) { return sum_run(row(o, b), n); }, add,
          [&](int64_t o, Acc<T> acc) {
            dst[o] = op == ReduceOp::Sum ? static_cast<T>(acc) : static_cast<T>(static_cast<double>(acc) / inner);
          });
      break;
    }
    case ReduceOp::Var: {
      // Two passes per row (mean, then squared deviations): no cancellation, unlike
      // E[x^2] - E[x]^2.
      std::vector<double> means(outer);
      reduce_blocked<double>(
          outer, inner, [&](int64_t o, int64_t b, int64_t n) { return static_cast<double>(sum_run(row(o, b), n)); },
          add, [&](int64_t o, double acc) { means[o] = acc / inner; });
      T* dst = static_cast<T*>(out.raw_data());
      double divisor = std::max(0.0, static_cast<double>(inner) - correction);
      reduce_blocked<double>(
          outer, inner,
          [&](int64_t o, int64_t b, int64_t n) { return squared_deviation_run(row(o, b), n, means[o]); }, add,
          [&](int64_t o, double acc) { dst[o] = static_cast<T>(acc / divisor); });
      break;
    }
    case ReduceOp::Max:
    case ReduceOp::Min: {
      T* dst = static_cast<T*>(out.raw_data());
      auto store = [&](int64_t o, T v) { dst[o] = v; };
      if (op == ReduceOp::Max)
        reduce_blocked<T>(
            outer, inner, [&](int64_t o, int64_t b, int64_t n) { return extremum_run<true>(row(o, b), n); },
            take<true, T>, store);
      else
        reduce_blocked<T>(
            outer, inner, [&](int64_t o, int64_t b, int64_t n) { return extremum_run<false>(row(o, b), n); },
            take<false, T>, store);
      break;
    }
    case ReduceOp::ArgMax:
      arg_rows<true>(in, outer, inner, static_cast<int64_t*>(out.raw_data()), values);
      break;
    case ReduceOp::ArgMin:
      arg_rows<false>(in, outer, inner, static_cast<int64_t*>(out.raw_data()), values);
      break;
  }
}

// --- columns (post > 1) -----------------------------------------------------------------

// Sums of w columns. Four rows are added together before they meet the accumulator,
// which quarters the accumulator traffic (the order is still fixed by the shape).
template <class T>
void column_sums(const T* p, int64_t inner, int64_t post, int w, Acc<T>* acc) {
  for (int j = 0; j < w; ++j) acc[j] = 0;
  int64_t i = 0;
  for (; i + 4 <= inner; i += 4) {
    const T *r0 = p + i * post, *r1 = r0 + post, *r2 = r1 + post, *r3 = r2 + post;
    for (int j = 0; j < w; ++j)
      acc[j] += (static_cast<Acc<T>>(r0[j]) + static_cast<Acc<T>>(r1[j])) +
                (static_cast<Acc<T>>(r2[j]) + static_cast<Acc<T>>(r3[j]));
  }
  for (; i < inner; ++i)
    for (int j = 0; j < w; ++j) acc[j] += static_cast<Acc<T>>(p[i * post + j]);
}

// Extrema of w columns, with extremum_run's vectorisable scan and NaN check.
template <bool kMax, class T>
void column_extremum(const T* p, int64_t inner, int64_t post, int w, T* dst) {
  T check[kColumns];
  for (int j = 0; j < w; ++j) dst[j] = check[j] = p[j];
  for (int64_t i = 1; i < inner; ++i)
    for (int j = 0; j < w; ++j) {
      T v = p[i * post + j];
      dst[j] = (kMax ? v > dst[j] : v < dst[j]) ? v : dst[j];
      check[j] += v;
    }
  if constexpr (std::is_floating_point_v<T>) {
    for (int j = 0; j < w; ++j) {
      if (!is_nan(check[j])) continue;
      T best = p[j];
      for (int64_t i = 1; i < inner; ++i) best = take<kMax>(best, p[i * post + j]);
      dst[j] = best;
    }
  }
}

// Reduces w <= kColumns neighbouring columns: element (i, j) at p[i * post + j]; results
// go to out[j] (and values[j] for ArgMax / ArgMin).
template <class T>
void reduce_column_block(ReduceOp op, const T* p, int64_t inner, int64_t post, int w, void* out, T* values,
                         double correction) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
    case ReduceOp::Var: {
      Acc<T> acc[kColumns];
      column_sums(p, inner, post, w, acc);
      T* dst = static_cast<T*>(out);
      if (op == ReduceOp::Sum) {
        for (int j = 0; j < w; ++j) dst[j] = static_cast<T>(acc[j]);
        break;
      }
      double mean[kColumns];
      for (int j = 0; j < w; ++j) mean[j] = static_cast<double>(acc[j]) / inner;
      if (op == ReduceOp::Mean) {
        for (int j = 0; j < w; ++j) dst[j] = static_cast<T>(mean[j]);
        break;
      }
      double sq[kColumns] = {};
      for (int64_t i = 0; i < inner; ++i)
        for (int j = 0; j < w; ++j) {
          double d = static_cast<double>(p[i * post + j]) - mean[j];
          sq[j] += d * d;
        }
      double divisor = std::max(0.0, static_cast<double>(inner) - correction);
      for (int j = 0; j < w; ++j) dst[j] = static_cast<T>(sq[j] / divisor);
      break;
    }
    case ReduceOp::Max:
    case ReduceOp::Min: {
      if (op == ReduceOp::Max) column_extremum<true>(p, inner, post, w, static_cast<T*>(out));
      else column_extremum<false>(p, inner, post, w, static_cast<T*>(out));
      break;
    }
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin: {
      T best[kColumns];
      int64_t index[kColumns] = {};
      for (int j = 0; j < w; ++j) best[j] = p[j];
      for (int64_t i = 1; i < inner; ++i)
        for (int j = 0; j < w; ++j) {
          T v = p[i * post + j];
          bool better = op == ReduceOp::ArgMax ? beats<true>(v, best[j]) : beats<false>(v, best[j]);
          best[j] = better ? v : best[j];
          index[j] = better ? i : index[j];
        }
      for (int j = 0; j < w; ++j) static_cast<int64_t*>(out)[j] = index[j];
      if (values)
        for (int j = 0; j < w; ++j) values[j] = best[j];
      break;
    }
  }
}

template <class T>
void reduce_columns(ReduceOp op, const T* in, int64_t outer, int64_t inner, int64_t post, const Tensor& out,
                    T* values, double correction) {
  const int64_t chunks = (post + kColumns - 1) / kColumns;
  char* dst = static_cast<char*>(out.raw_data());
  const int64_t out_size = out.element_size();
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(inner * kColumns, 1));
  cpu::parallel_for(0, outer * chunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      int64_t o = k / chunks, p0 = (k % chunks) * kColumns;
      int w = static_cast<int>(std::min<int64_t>(kColumns, post - p0));
      int64_t at = o * post + p0;
      reduce_column_block(op, in + o * inner * post + p0, inner, post, w, dst + at * out_size,
                          values ? values + at : nullptr, correction);
    }
  });
}

void reduce_kernel(ReduceOp op, const Tensor& in, int64_t outer, int64_t inner, int64_t post, const Tensor& out,
                   const Tensor& values, double correction) {
  dispatch_dtype(in.dtype(), DTypeSet::Numeric, "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.raw_data());
    T* vals = values.defined() ? static_cast<T*>(values.raw_data()) : nullptr;
    if (post == 1) reduce_rows<T>(op, x, outer, inner, out, vals, correction);
    else reduce_columns<T>(op, x, outer, inner, post, out, vals, correction);
  });
}

}  // namespace

void cpu::register_reduce_kernels() {
  reduce_stub.set(DeviceType::CPU, &reduce_kernel);
}

}  // namespace weft
