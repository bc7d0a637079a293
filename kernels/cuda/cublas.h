// cuBLAS in weft: the status check and a handle prepared for one op's calls (CUDA-only
// header).
//
// Every matrix product goes through CublasHandle, which sets up this thread's handle for
// the op's device the same way each time: bound to the device's current stream, given
// a workspace from weft's caching allocator, and with TF32 tensor cores only when
// allow_tf32() says so. With a workspace of its own per call (rather than cuBLAS's
// internal pool, which streams share) the results do not depend on which streams ran
// before, and the memory shows up in weft's per-device accounting.
#pragma once

#include <cublas_v2.h>

#include "core/tensor.h"
#include "kernels/cuda/check.h"

namespace weft::cuda {

// So that WEFT_CUDA_CHECK(cublas...(...)) reports cuBLAS's own status name and text.
void check_status(cublasStatus_t status, const char* what, const char* file, int line);

// This thread's cuBLAS handle for the GPU of `device`, ready for calls on the current
// stream of `device`. The caller holds a DeviceGuard for `device` and keeps this object
// alive until its calls are queued: it owns the workspace, whose memory the caching
// allocator hands out again only after the stream has run those calls.
class CublasHandle {
 public:
  explicit CublasHandle(Device device);
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
  Tensor workspace_;
};

}  // namespace weft::cuda
