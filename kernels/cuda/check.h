// Error checks for the CUDA runtime and for kernel launches.
//
// Every CUDA call and every launch in weft goes through WEFT_CUDA_CHECK /
// WEFT_CUDA_CHECK_LAUNCH, so a failure becomes a weft::Error naming the call, the file
// and line, and CUDA's own description. The macro is generic: cublas.h and cudnn.h add
// check_status overloads for their status types, so one macro checks every library.
#pragma once

#include <cuda_runtime_api.h>

namespace weft::cuda {

void check_status(cudaError_t status, const char* what, const char* file, int line);

}  // namespace weft::cuda

#define WEFT_CUDA_CHECK(expr) ::weft::cuda::check_status((expr), #expr, __FILE__, __LINE__)
// After every <<<...>>>: reports a bad launch configuration at the launch that made it.
#define WEFT_CUDA_CHECK_LAUNCH() ::weft::cuda::check_status(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
