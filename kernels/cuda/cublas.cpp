// cuBLAS handles per (GPU, thread), their status check, and per-call setup.
#include "kernels/cuda/cublas.h"

#include "core/error.h"
#include "kernels/cuda/handle_pool.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

namespace weft::cuda {

void check_status(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]] return;
  WEFT_FAIL("cuBLAS error ", cublasGetStatusName(status), " (", cublasGetStatusString(status), ") in ", what,
            " at ", file, ":", line);
}

namespace {

cublasHandle_t create_handle() {
  cublasHandle_t handle = nullptr;
  WEFT_CUDA_CHECK(cublasCreate(&handle));
  return handle;
}

using CublasPool = HandlePool<cublasHandle_t, &create_handle>;

// cuBLAS's recommended workspace: 32 MiB on Hopper and newer, 4 MiB before (the sizes of
// its own default pool), enough for every GEMM kernel it would pick.
size_t workspace_bytes(int gpu) {
  int major = 0;
  WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu));
  return size_t(major >= 9 ? 32 : 4) << 20;
}

}  // namespace

CublasHandle::CublasHandle(Device device) {
  const int gpu = physical_device(device);
  handle_ = CublasPool::get(gpu);
  // cublasSetStream drops any workspace set before, so the workspace is set after it.
  WEFT_CUDA_CHECK(cublasSetStream(handle_, current_native_stream(device)));
  const size_t bytes = workspace_bytes(gpu);
  workspace_ = empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::UInt8, device));
  WEFT_CUDA_CHECK(cublasSetWorkspace(handle_, workspace_.raw_data(), bytes));
  // The default math mode computes float32 products in float32 (no TF32 since cuBLAS 11).
  WEFT_CUDA_CHECK(cublasSetMathMode(handle_, allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

}  // namespace weft::cuda
