// CPU fused attention, forward and backward (contract: kernels/attention_kernels.h).
//
// FlashAttention's tiling on the host: the scores are formed kBlock x kBlock at a time, so
// a tile of scores, probabilities and their gradients stays in L1/L2 and the L x S matrix
// is never stored. The tile products are Eigen GEMMs on Eigen::Map views (as
// kernels/cpu/matmul.cpp; Eigen's own threading off); the row passes between them are
// plain loops that vectorise (cpu::exp_fast, cpu::row_max, cpu::lane_sum).
//
//   forward   a task per (bh, block of kBlock queries) walks the key tiles with an online
//             softmax: a running maximum m and sum l per row; when m grows, l and the
//             output accumulator are rescaled by exp(m_old - m_new).
//   backward  two passes, each writing its outputs alone: a task per (bh, key block) sums
//             grad_k and grad_v over the query tiles; a task per (bh, query block) sums
//             grad_q over the key tiles. Both recompute P = exp(x - lse) tile by tile
//             (7 tile products per tile pair instead of 5, the price of needing no
//             atomics and no per-thread copies of grad_q).
// Causal tiles past the diagonal are skipped.
//
// Precision: products and the accumulators of out and the gradients in the input's dtype
// (as the reference's matmuls); exp in the input's dtype; the softmax row sums l and
// D = rowsum(grad_out * out) in float64. Every output element is computed by one task in an
// order fixed by the shapes, and tasks never share outputs: the result is the same on any
// thread count.
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention_kernels.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/softmax_rows.h"

namespace weft {

namespace {

// Queries and keys per tile: a 64 x 64 tile of scores is 16 KiB in float32, and 64 rows
// keep the GEMMs' packing cost small next to their multiply-adds.
constexpr int64_t kBlock = 64;

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;

// rows x cols row-major at p with leading dimension ld.
template <class T>
ConstMap<T> matrix(const T* p, int64_t rows, int64_t cols, int64_t ld) {
  return ConstMap<T>(p, rows, cols, Eigen::OuterStride<>(ld));
}
template <class T>
MutMap<T> mutable_matrix(T* p, int64_t rows, int64_t cols, int64_t ld) {
  return MutMap<T>(p, rows, cols, Eigen::OuterStride<>(ld));
}

// The first key masked for query i within a tile of n keys starting at j0 (n when none is).
inline int64_t visible_keys(bool is_causal, int64_t i, int64_t j0, int64_t n) {
  return is_causal ? std::clamp<int64_t>(i - j0 + 1, 0, n) : n;
}

// Whether a task of this many multiply-adds in total is worth threads.
constexpr int64_t kParallelMacs = int64_t(1) << 18;

// Calls task(scratch, b, block) for every block of every batch entry, on the threads when there
// is enough work; each thread makes one scratch with make_scratch(). Under causal masking the
// blocks' costs form a ramp and parallel_for hands each thread a contiguous range, so blocks
// are visited in the order 0, n - 1, 1, n - 2, ..., which pairs cheap and dear ones in every
// range. Tasks share no output, so the order changes no result.
template <class MakeScratch, class F>
void for_each_block(int64_t bh, int64_t blocks, int64_t total_macs, const MakeScratch& make_scratch, const F& task) {
  const int64_t tasks = bh * blocks;
  cpu::parallel_for(0, tasks, total_macs >= kParallelMacs ? 1 : tasks, [&](int64_t begin, int64_t end) {
    auto scratch = make_scratch();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t % blocks;
      task(scratch, t / blocks, i % 2 == 0 ? i / 2 : blocks - 1 - i / 2);
    }
  });
}

// The sizes of one call (its tensors are [bh, ...]), its scale and its masking.
struct Dims {
  int64_t bh, L, S, E, Ev;
  double scale;
  bool causal;
  int64_t q_blocks() const { return (L + kBlock - 1) / kBlock; }
  int64_t k_blocks() const { return (S + kBlock - 1) / kBlock; }
  // Key tiles that the query block at i0 (m rows) sees: all, or those up to its last row's diagonal.
  int64_t k_tiles_for(int64_t i0, int64_t m) const {
    return causal ? std::min(k_blocks(), (i0 + m - 1) / kBlock + 1) : k_blocks();
  }
  // The first query tile that sees key block j0 (causal: the one holding row j0).
  int64_t first_q_tile_for(int64_t j0) const { return causal ? std::min(j0 / kBlock, q_blocks()) : 0; }
  int64_t macs() const { return bh * L * S * (E + Ev); }
};

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), v.size(2), scale, causal};
}

// --- forward -----------------------------------------------------------------------------

// A thread's tiles in the forward: scores (then probabilities), the output accumulator, and
// each row's running maximum and sum.
template <class T>
struct ForwardScratch {
  Matrix<T> s, acc;
  T row_m[kBlock];
  double row_l[kBlock];
};

// Out and lse of the query block qb of batch entry b.
template <class T>
void forward_block(const Dims& d, const T* q, const T* k, const T* v, T* out, T* lse, ForwardScratch<T>& w,
                   int64_t b, int64_t qb) {
  const T scale = static_cast<T>(d.scale);
  const int64_t i0 = qb * kBlock, m = std::min(kBlock, d.L - i0);
  const auto qt = matrix(q + (b * d.L + i0) * d.E, m, d.E, d.E);
  const T* kb = k + b * d.S * d.E;
  const T* vb = v + b * d.S * d.Ev;
  T* row_m = w.row_m;
  double* row_l = w.row_l;
  w.acc.topRows(m).setZero();
  std::fill(row_m, row_m + m, -std::numeric_limits<T>::infinity());
  std::fill(row_l, row_l + m, 0.0);
  const int64_t tiles = d.k_tiles_for(i0, m);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t j0 = t * kBlock, n = std::min(kBlock, d.S - j0);
    auto st = mutable_matrix(w.s.data(), m, n, kBlock);
    st.noalias() = qt * matrix(kb + j0 * d.E, n, d.E, d.E).transpose();
    for (int64_t r = 0; r < m; ++r) {
      T* x = w.s.data() + r * kBlock;
      const int64_t nv = visible_keys(d.causal, i0 + r, j0, n);
      std::fill(x + nv, x + n, T(0));
      if (nv == 0) continue;  // no key of this tile: m, l and the accumulator stay
      for (int64_t c = 0; c < nv; ++c) x[c] *= scale;
      const T m_new = std::max(row_m[r], cpu::row_max(x, nv));
      // Equal maxima (the first tile of a row whose scores are all -inf too) rescale by 1,
      // never by exp(-inf + inf).
      const T alpha = row_m[r] == m_new ? T(1) : cpu::exp_fast(static_cast<T>(row_m[r] - m_new));
      for (int64_t c = 0; c < nv; ++c) x[c] = cpu::exp_fast(static_cast<T>(x[c] - m_new));
      row_l[r] = row_l[r] * static_cast<double>(alpha) +
                 cpu::lane_sum(nv, [x](int64_t c) { return static_cast<double>(x[c]); });
      row_m[r] = m_new;
      if (alpha != T(1)) w.acc.row(r) *= alpha;
    }
    w.acc.topRows(m).noalias() += st * matrix(vb + j0 * d.Ev, n, d.Ev, d.Ev);
  }
  for (int64_t r = 0; r < m; ++r) {
    const double inv = 1.0 / row_l[r];
    T* o = out + (b * d.L + i0 + r) * d.Ev;
    for (int64_t c = 0; c < d.Ev; ++c) o[c] = static_cast<T>(static_cast<double>(w.acc(r, c)) * inv);
    lse[b * d.L + i0 + r] = static_cast<T>(static_cast<double>(row_m[r]) + std::log(row_l[r]));
  }
}

void forward_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    double scale, bool is_causal) {
  const Dims d = dims_of(q, k, v, scale, is_causal);
  dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *pq = q.data_ptr<T>(), *pk = k.data_ptr<T>(), *pv = v.data_ptr<T>();
    T *po = out.data_ptr<T>(), *pl = lse.data_ptr<T>();
    for_each_block(
        d.bh, d.q_blocks(), d.macs(),
        [&] {
          ForwardScratch<T> w;
          w.s.resize(kBlock, kBlock);
          w.acc.resize(kBlock, d.Ev);
          return w;
        },
        [&](ForwardScratch<T>& w, int64_t b, int64_t qb) { forward_block(d, pq, pk, pv, po, pl, w, b, qb); });
  });
}

// --- backward ----------------------------------------------------------------------------

// The tensors of one backward call, as pointers to batch entry 0.
template <class T>
struct Grads {
  const T *g, *q, *k, *v, *lse, *delta;
  T *dq, *dk, *dv;
};

// For the tile of queries i0 .. i0 + m and keys j0 .. j0 + n of batch entry b, given the raw
// scores q_i . k_j in p (leading dimension kBlock) and dO v^T in dp: p becomes
// P = exp(scale * score - lse) and dp becomes dS = P * (dO v^T - D), both 0 where masked.
template <class T>
void probabilities_and_ds(const Dims& d, const Grads<T>& a, int64_t b, int64_t i0, int64_t m, int64_t j0, int64_t n,
                          T* p, T* dp) {
  const T scale = static_cast<T>(d.scale);
  for (int64_t r = 0; r < m; ++r) {
    T* x = p + r * kBlock;
    T* y = dp + r * kBlock;
    const T lse = a.lse[b * d.L + i0 + r], delta = a.delta[b * d.L + i0 + r];
    const int64_t nv = visible_keys(d.causal, i0 + r, j0, n);
    for (int64_t c = 0; c < nv; ++c) x[c] = cpu::exp_fast(static_cast<T>(x[c] * scale - lse));
    for (int64_t c = 0; c < nv; ++c) y[c] = x[c] * (y[c] - delta);
    std::fill(x + nv, x + n, T(0));
    std::fill(y + nv, y + n, T(0));
  }
}

// D_i = sum_c dO_ic out_ic in float64, for every row of every batch entry.
template <class T>
void delta_typed(const Dims& d, const T* g, const T* out, T* delta) {
  const int64_t rows = d.bh * d.L;
  cpu::parallel_for(0, rows, std::max<int64_t>(1, cpu::kGrain / d.Ev), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* gi = g + i * d.Ev;
      const T* oi = out + i * d.Ev;
      delta[i] = static_cast<T>(
          cpu::lane_sum(d.Ev, [gi, oi](int64_t c) { return static_cast<double>(gi[c]) * static_cast<double>(oi[c]); }));
    }
  });
}

// grad_k and grad_v of one key block, summed over the query tiles that see it.
template <class T>
void key_block_backward(const Dims& d, const Grads<T>& a, int64_t b, int64_t j0, int64_t n, Matrix<T>& p,
                        Matrix<T>& dp, Matrix<T>& dk, Matrix<T>& dv) {
  const T* kb = a.k + (b * d.S + j0) * d.E;
  const T* vb = a.v + (b * d.S + j0) * d.Ev;
  dk.topRows(n).setZero();
  dv.topRows(n).setZero();
  for (int64_t t = d.first_q_tile_for(j0); t < d.q_blocks(); ++t) {
    const int64_t i0 = t * kBlock, m = std::min(kBlock, d.L - i0);
    const auto qt = matrix(a.q + (b * d.L + i0) * d.E, m, d.E, d.E);
    const auto gt = matrix(a.g + (b * d.L + i0) * d.Ev, m, d.Ev, d.Ev);
    auto pt = mutable_matrix(p.data(), m, n, kBlock);
    auto dst = mutable_matrix(dp.data(), m, n, kBlock);
    pt.noalias() = qt * matrix(kb, n, d.E, d.E).transpose();
    dst.noalias() = gt * matrix(vb, n, d.Ev, d.Ev).transpose();
    probabilities_and_ds(d, a, b, i0, m, j0, n, p.data(), dp.data());
    dv.topRows(n).noalias() += pt.transpose() * gt;
    dk.topRows(n).noalias() += dst.transpose() * qt;
  }
  const T scale = static_cast<T>(d.scale);
  for (int64_t r = 0; r < n; ++r) {
    T* dkr = a.dk + (b * d.S + j0 + r) * d.E;
    T* dvr = a.dv + (b * d.S + j0 + r) * d.Ev;
    for (int64_t c = 0; c < d.E; ++c) dkr[c] = dk(r, c) * scale;
    for (int64_t c = 0; c < d.Ev; ++c) dvr[c] = dv(r, c);
  }
}

// grad_q of one query block, summed over the key tiles it sees.
template <class T>
void query_block_backward(const Dims& d, const Grads<T>& a, int64_t b, int64_t i0, int64_t m, Matrix<T>& p,
                          Matrix<T>& dp, Matrix<T>& dq) {
  const auto qt = matrix(a.q + (b * d.L + i0) * d.E, m, d.E, d.E);
  const auto gt = matrix(a.g + (b * d.L + i0) * d.Ev, m, d.Ev, d.Ev);
  dq.topRows(m).setZero();
  const int64_t tiles = d.k_tiles_for(i0, m);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t j0 = t * kBlock, n = std::min(kBlock, d.S - j0);
    const auto kt = matrix(a.k + (b * d.S + j0) * d.E, n, d.E, d.E);
    auto pt = mutable_matrix(p.data(), m, n, kBlock);
    auto dst = mutable_matrix(dp.data(), m, n, kBlock);
    pt.noalias() = qt * kt.transpose();
    dst.noalias() = gt * matrix(a.v + (b * d.S + j0) * d.Ev, n, d.Ev, d.Ev).transpose();
    probabilities_and_ds(d, a, b, i0, m, j0, n, p.data(), dp.data());
    dq.topRows(m).noalias() += dst * kt;
  }
  const T scale = static_cast<T>(d.scale);
  for (int64_t r = 0; r < m; ++r) {
    T* dqr = a.dq + (b * d.L + i0 + r) * d.E;
    for (int64_t c = 0; c < d.E; ++c) dqr[c] = dq(r, c) * scale;
  }
}

// A thread's tiles in the backward: P, dP (then dS), and the accumulators of its outputs
// (grad_k and grad_v, or grad_q).
template <class T>
struct BackwardScratch {
  Matrix<T> p, dp, acc_e, acc_ev;
};

template <class T>
auto backward_scratch(int64_t E, int64_t Ev) {
  return [E, Ev] {
    BackwardScratch<T> w;
    w.p.resize(kBlock, kBlock);
    w.dp.resize(kBlock, kBlock);
    w.acc_e.resize(kBlock, E);
    w.acc_ev.resize(kBlock, Ev);
    return w;
  };
}

template <class T>
void backward_typed(const Dims& d, const Grads<T>& a, const T* out, T* delta) {
  delta_typed(d, a.g, out, delta);
  // Each pass costs 1.5 to 2 forwards: threads pay off at half the forward's size.
  const int64_t macs = 2 * d.macs();
  for_each_block(d.bh, d.k_blocks(), macs, backward_scratch<T>(d.E, d.Ev),
                 [&](BackwardScratch<T>& w, int64_t b, int64_t kb) {
                   const int64_t j0 = kb * kBlock;
                   key_block_backward(d, a, b, j0, std::min(kBlock, d.S - j0), w.p, w.dp, w.acc_e, w.acc_ev);
                 });
  for_each_block(d.bh, d.q_blocks(), macs, backward_scratch<T>(d.E, 0),
                 [&](BackwardScratch<T>& w, int64_t b, int64_t qb) {
                   const int64_t i0 = qb * kBlock;
                   query_block_backward(d, a, b, i0, std::min(kBlock, d.L - i0), w.p, w.dp, w.acc_e);
                 });
}

void backward_kernel(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, const Tensor& delta, const Tensor& grad_q, const Tensor& grad_k,
                     const Tensor& grad_v, double scale, bool is_causal) {
  const Dims d = dims_of(q, k, v, scale, is_causal);
  dispatch_floating(q.dtype(), "scaled_dot_product_attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Grads<T> a{grad_out.data_ptr<T>(), q.data_ptr<T>(),      k.data_ptr<T>(),      v.data_ptr<T>(),
                     lse.data_ptr<T>(),      delta.data_ptr<T>(),  grad_q.data_ptr<T>(), grad_k.data_ptr<T>(),
                     grad_v.data_ptr<T>()};
    backward_typed<T>(d, a, out.data_ptr<T>(), delta.data_ptr<T>());
  });
}

}  // namespace

void cpu::register_attention_kernels() {
  attention_forward_stub.set(DeviceType::CPU, &forward_kernel);
  attention_backward_stub.set(DeviceType::CPU, &backward_kernel);
}

}  // namespace weft
