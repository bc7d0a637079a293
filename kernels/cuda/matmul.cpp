// CUDA matrix products: cuBLAS strided-batched GEMM, row-major through the transpose.
//
// cuBLAS is column-major and weft row-major. Row-major memory of an [r, c] matrix is, to
// cuBLAS, the column-major [c, r] matrix of its transpose, so out = a @ b is asked of
// cuBLAS as out^T = b^T @ a^T: its "A" is b, its "B" is a, and its m and n are our n and
// m. An operand is passed as it lies, with op N when it is row-major (unit column
// stride), with op T when it is column-major (a transposed view, unit row stride), and
// is copied to contiguous rows only when it is neither (a slice with a step in the last
// two dims, an expanded row). Batch dims that are contiguous in all three tensors are
// merged (broadcast dims have stride 0 in a or b, which cuBLAS's batch stride accepts);
// the largest merged dim is cuBLAS's batch, any others are looped over on the host.
//
// cuBLAS gives the same bits on every run for a given GPU and sizes: with its own
// workspace per call (CublasHandle) it does not depend on what other streams did.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/cublas.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"
#include "kernels/linalg_kernels.h"

namespace weft::cuda {

namespace {

// The transpose of an operand matrix as cuBLAS reads it (column-major): op and leading
// dimension.
struct CublasOperand {
  cublasOperation_t op;
  int64_t ld;
};

// How cuBLAS reads the transpose of t's last two dims [rows, cols] in place, if it can.
// A dim of size 1 has no meaningful stride and never disqualifies a layout; cuBLAS wants
// ld >= the number of rows it stores.
std::optional<CublasOperand> in_place(const Tensor& t) {
  const int64_t d = t.dim();
  const int64_t rows = t.size(d - 2), cols = t.size(d - 1), row_stride = t.stride(d - 2), col_stride = t.stride(d - 1);
  if (cols <= 1 || col_stride == 1) {  // row-major: as column-major it already is the transpose
    const int64_t ld = rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return CublasOperand{CUBLAS_OP_N, ld};
  }
  if (rows <= 1 || row_stride == 1) {  // column-major: cuBLAS transposes it
    const int64_t ld = cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return CublasOperand{CUBLAS_OP_T, ld};
  }
  return std::nullopt;
}

// t as cuBLAS will read it. When it cannot be read in place, t becomes a copy with
// contiguous matrices; broadcast batch dims (stride 0) stay broadcast: they are narrowed
// to one entry before the copy and expanded again after it.
CublasOperand prepare(Tensor& t) {
  if (std::optional<CublasOperand> op = in_place(t)) return *op;
  Tensor compact = t.detach();
  for (int64_t d = 0; d + 2 < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) compact = compact.narrow(d, 0, 1);
  t = compact.contiguous().expand(t.shape());
  return {CUBLAS_OP_N, t.size(-1)};  // contiguous rows of t.size(-1) >= 1 elements
}

// A batch dim after merging: its size and the element stride of a, b and out along it.
struct BatchDim {
  int64_t size, a, b, out;
};

// The batch dims of a, b and out (equal sizes), size-1 dims dropped and neighbours merged
// where every tensor steps over the inner one contiguously.
std::vector<BatchDim> merged_batch_dims(const Tensor& a, const Tensor& b, const Tensor& out) {
  std::vector<BatchDim> dims;
  for (int64_t d = 0; d + 2 < out.dim(); ++d) {
    const BatchDim next{out.size(d), a.stride(d), b.stride(d), out.stride(d)};
    if (next.size == 1) continue;
    if (!dims.empty()) {
      BatchDim& last = dims.back();
      if (last.a == next.a * next.size && last.b == next.b * next.size && last.out == next.out * next.size) {
        last = {last.size * next.size, next.a, next.b, next.out};
        continue;
      }
    }
    dims.push_back(next);
  }
  return dims;
}

template <class T>
void matmul_typed(Tensor a, Tensor b, const Tensor& out, bool accumulate) {
  const int64_t nd = out.dim();
  const int64_t m = out.size(nd - 2), n = out.size(nd - 1), k = a.size(nd - 1);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  cudaStream_t stream = current_native_stream(out.device());
  if (k == 0) {  // an empty sum: zeros, or nothing to add
    if (!accumulate) WEFT_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream));
    return;
  }
  const CublasOperand op_a = prepare(a), op_b = prepare(b);

  // cuBLAS batches over the largest merged dim; the host loops over the rest.
  std::vector<BatchDim> dims = merged_batch_dims(a, b, out);
  BatchDim batched{1, 0, 0, 0};
  if (!dims.empty()) {
    auto largest = std::max_element(dims.begin(), dims.end(),
                                    [](const BatchDim& x, const BatchDim& y) { return x.size < y.size; });
    batched = *largest;
    dims.erase(largest);
  }
  int64_t outer = 1;
  for (const BatchDim& d : dims) outer *= d.size;

  constexpr bool is_float = std::is_same_v<T, float>;
  const cudaDataType type = is_float ? CUDA_R_32F : CUDA_R_64F;
  const cublasComputeType_t compute =
      is_float ? (allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  const T alpha = 1, beta = accumulate ? 1 : 0;
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());

  CublasHandle handle(out.device());
  std::vector<int64_t> index(dims.size(), 0);  // odometer over the host-looped dims
  for (int64_t step = 0; step < outer; ++step) {
    int64_t off_a = 0, off_b = 0, off_c = 0;
    for (size_t d = 0; d < dims.size(); ++d) {
      off_a += index[d] * dims[d].a;
      off_b += index[d] * dims[d].b;
      off_c += index[d] * dims[d].out;
    }
    WEFT_CUDA_CHECK(cublasGemmStridedBatchedEx_64(
        handle.get(), op_b.op, op_a.op, n, m, k, &alpha, pb + off_b, type, op_b.ld, batched.b, pa + off_a, type,
        op_a.ld, batched.a, &beta, pc + off_c, type, n, batched.out, batched.size, compute, CUBLAS_GEMM_DEFAULT));
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
      if (++index[d] < dims[d].size) break;
      index[d] = 0;
    }
  }
}

void matmul_kernel(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  dispatch_floating(out.dtype(), "matmul",
                    [&](auto tag) { matmul_typed<typename decltype(tag)::type>(a, b, out, accumulate); });
}

}  // namespace

void register_matmul_kernels() { matmul_stub.set(DeviceType::CUDA, &matmul_kernel); }

}  // namespace weft::cuda
