// CPU matrix products: Eigen's GEMM over Eigen::Map views of the tensors' own memory.
//
// Each operand matrix is mapped in place when one of its two dims has unit stride: a
// row-major map for [m, k] with stride (ld, 1), a column-major map for a transposed view
// with stride (1, ld). Only a matrix with neither (a stride-2 slice, an expanded row) is
// copied. Eigen's own OpenMP threading is off: its blocking depends on the thread count,
// which would make float results depend on it too. Instead the work is cut into tasks
// (batch element x block of rows or columns) whose boundaries depend only on the sizes,
// and the tasks are spread over threads; each output element is computed by one task,
// always the same way, so the result is the same for any thread count.
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>

#include <algorithm>
#include <vector>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/linalg_kernels.h"

namespace weft {

namespace {

template <class T>
using RowMajorMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                               Eigen::OuterStride<>>;
template <class T>
using ColMajorMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>, 0,
                               Eigen::OuterStride<>>;
template <class T>
using OutMap =
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;

// One operand matrix: element (i, j) is data[i * row_stride + j * col_stride].
template <class T>
struct MatrixRef {
  const T* data;
  int64_t rows, cols, row_stride, col_stride;

  // Leading dimension if the matrix can be mapped row-major (unit column stride), else 0.
  // A dim of size 1 has no meaningful stride, so it never disqualifies a layout.
  int64_t row_major_ld() const {
    if (cols > 1 && col_stride != 1) return 0;
    if (rows <= 1) return std::max<int64_t>(cols, 1);
    return row_stride >= cols ? row_stride : 0;
  }
  int64_t col_major_ld() const {
    if (rows > 1 && row_stride != 1) return 0;
    if (cols <= 1) return std::max<int64_t>(rows, 1);
    return col_stride >= rows ? col_stride : 0;
  }
};

// Storage for a matrix that cannot be mapped in place. Eigen's vector allocates aligned
// to its packet size, so summation order never depends on where malloc put the copy.
template <class T>
using Scratch = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// Returns m mapped in place, or copied row-major into `scratch`.
template <class T>
MatrixRef<T> mappable(const MatrixRef<T>& m, Scratch<T>& scratch) {
  if (m.row_major_ld() || m.col_major_ld()) return m;
  scratch.resize(m.rows * m.cols);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) scratch[i * m.cols + j] = m.data[i * m.row_stride + j * m.col_stride];
  return {scratch.data(), m.rows, m.cols, m.cols, 1};
}

template <class T, class A, class B>
void gemm_maps(const A& a, const B& b, T* c, int64_t ldc, bool accumulate) {
  OutMap<T> out(c, a.rows(), b.cols(), Eigen::OuterStride<>(ldc));
  if (accumulate) out.noalias() += a * b;
  else out.noalias() = a * b;
}

template <class T, class A>
void gemm_rhs(const A& a, const MatrixRef<T>& b, T* c, int64_t ldc, bool accumulate) {
  if (int64_t ld = b.row_major_ld())
    gemm_maps<T>(a, RowMajorMap<T>(b.data, b.rows, b.cols, Eigen::OuterStride<>(ld)), c, ldc, accumulate);
  else
    gemm_maps<T>(a, ColMajorMap<T>(b.data, b.rows, b.cols, Eigen::OuterStride<>(b.col_major_ld())), c, ldc,
                 accumulate);
}

// c[m, n] (row-major, leading dimension ldc) = or += a @ b, on the calling thread.
template <class T>
void gemm(MatrixRef<T> a, MatrixRef<T> b, T* c, int64_t ldc, bool accumulate) {
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    return;
  }
  Scratch<T> scratch_a, scratch_b;
  a = mappable(a, scratch_a);
  b = mappable(b, scratch_b);
  if (int64_t ld = a.row_major_ld())
    gemm_rhs<T>(RowMajorMap<T>(a.data, m, k, Eigen::OuterStride<>(ld)), b, c, ldc, accumulate);
  else
    gemm_rhs<T>(ColMajorMap<T>(a.data, m, k, Eigen::OuterStride<>(a.col_major_ld())), b, c, ldc, accumulate);
}

// A task computes about this many multiply-adds: enough that packing an operand block
// and waking a thread are small next to it.
constexpr int64_t kTaskMacs = int64_t(1) << 20;
// Below this many multiply-adds in total the product runs on the calling thread.
constexpr int64_t kParallelMacs = int64_t(1) << 18;
constexpr int64_t kMinBlock = 32;

// Element offsets of every batch entry of t (dims [0, batch_dims) of its shape), in
// row-major order of the batch index.
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t batch_dims) {
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d < batch_dims; ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * t.shape()[d]);
    for (int64_t base : offsets)
      for (int64_t i = 0; i < t.shape()[d]; ++i) next.push_back(base + i * t.strides()[d]);
    offsets = std::move(next);
  }
  return offsets;
}

template <class T>
void matmul_typed(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  const int64_t batch_dims = out.dim() - 2;
  const int64_t m = out.shape()[batch_dims], n = out.shape()[batch_dims + 1], k = a.shape()[batch_dims + 1];
  const std::vector<int64_t> a_off = batch_offsets(a, batch_dims), b_off = batch_offsets(b, batch_dims);
  const int64_t batch = static_cast<int64_t>(a_off.size());
  if (batch == 0 || m == 0 || n == 0) return;

  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());
  const int64_t a_rs = a.strides()[batch_dims], a_cs = a.strides()[batch_dims + 1];
  const int64_t b_rs = b.strides()[batch_dims], b_cs = b.strides()[batch_dims + 1];

  // Split the longer of m and n into blocks sized from the shapes alone.
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t other = std::max<int64_t>((split_rows ? n : m) * k, 1);
  const int64_t block = std::max(kMinBlock, (kTaskMacs + other - 1) / other);
  const int64_t blocks = (extent + block - 1) / block;
  const int64_t tasks = batch * blocks;
  const bool parallel = batch * m * n * k >= kParallelMacs && tasks > 1;

  cpu::parallel_for(0, tasks, parallel ? 1 : tasks, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / blocks;
      const int64_t lo = (task % blocks) * block, len = std::min(block, extent - lo);
      MatrixRef<T> ma{pa + a_off[bi], m, k, a_rs, a_cs};
      MatrixRef<T> mb{pb + b_off[bi], k, n, b_rs, b_cs};
      T* c = pc + bi * m * n;
      if (split_rows) {
        ma.data += lo * a_rs;
        ma.rows = len;
        c += lo * n;
      } else {
        mb.data += lo * b_cs;
        mb.cols = len;
        c += lo;
      }
      gemm<T>(ma, mb, c, n, accumulate);
    }
  });
}

void matmul_kernel(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  dispatch_dtype(out.dtype(), DTypeSet::Floating, "matmul",
                 [&](auto tag) { matmul_typed<typename decltype(tag)::type>(a, b, out, accumulate); });
}

}  // namespace

void cpu::register_matmul_kernels() {
  matmul_stub.set(DeviceType::CPU, &matmul_kernel);
}

}  // namespace weft
