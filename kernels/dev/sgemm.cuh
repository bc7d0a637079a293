// Teaching ladder for single-precision matrix products, row-major C = A·B
// (A is M x K, B is K x N, C is M x N, all contiguous), from the naive kernel to one
// that reaches a good fraction of cuBLAS. Each rung fixes what bounds the previous one:
//
//   1 naive       one thread per C element, operands streamed from global memory (L2)
//   2 smem_tiled  32 x 32 tiles staged in shared memory: each global load is reused 32 times
//   3 regblock    128 x 128 block tile, 8 x 8 results per thread held in registers: each
//                 shared-memory load feeds 8 FMAs instead of 1
//   4 vectorised  rung 3 with float4 global and shared loads, A stored transposed in shared
//                 memory, and the next K slice prefetched into registers while the current
//                 one is multiplied (double-buffered shared memory, one barrier per slice)
//
// Rungs 1-3 take any sizes (edge tiles are guarded). Rung 4 needs N and K to be multiples
// of 4 and the three pointers 16-byte aligned (float4 accesses); its launcher checks this
// and throws weft::Error otherwise. Every launcher runs on `stream`, never synchronises,
// and checks its launch. kernels/dev/sgemm.cu also holds the CPU reference, validation
// and timing table (its main); bench/kernels compares these rungs with weft's matmul.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace weft::dev {

void sgemm_naive(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream);
void sgemm_smem_tiled(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream);
void sgemm_regblock(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream);
void sgemm_vectorised(int M, int N, int K, const float* A, const float* B, float* C, cudaStream_t stream);

// Whether sgemm_vectorised accepts these sizes and pointers.
bool sgemm_vectorised_supports(int M, int N, int K, const float* A, const float* B, float* C);

// The reference: row-major C = A·B through column-major cublasSgemm (computes
// C^T = B^T·A^T, which is C in row-major order, with no transposition copies).
void sgemm_cublas(cublasHandle_t handle, int M, int N, int K, const float* A, const float* B, float* C);

// A plain cuBLAS handle bound to `stream`, in CUBLAS_DEFAULT_MATH (float32, no TF32), with
// cuBLAS's own workspace: the float32 limit that the rungs and weft's matmul (which goes
// through weft::cuda::CublasHandle) are measured against.
class RawCublasHandle {
 public:
  explicit RawCublasHandle(cudaStream_t stream);
  ~RawCublasHandle();
  RawCublasHandle(const RawCublasHandle&) = delete;
  RawCublasHandle& operator=(const RawCublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// The rungs by number, for tables and command lines.
using SgemmLauncher = void (*)(int, int, int, const float*, const float*, float*, cudaStream_t);
struct SgemmVariant {
  int number;
  const char* name;
  SgemmLauncher launch;
};
inline constexpr SgemmVariant kSgemmVariants[] = {
    {1, "naive", &sgemm_naive},
    {2, "smem_tiled", &sgemm_smem_tiled},
    {3, "regblock", &sgemm_regblock},
    {4, "vectorised", &sgemm_vectorised},
};

}  // namespace weft::dev
