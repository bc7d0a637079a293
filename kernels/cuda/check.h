// Error checks for the CUDA runtime and for kernel launches.
//
// Every CUDA call and every launch in weft goes through WEFT_CUDA_CHECK /
// WEFT_CUDA_CHECK_LAUNCH, so a failure becomes a weft::Error naming the call (or the op
// whose kernel was launched), the file and line, and CUDA's own description. The macro is
// generic: cublas.h and cudnn.h add check_status overloads for their status types, so one
// macro checks every library.
#pragma once

#include <cuda_runtime_api.h>

namespace weft::cuda {

void check_status(cudaError_t status, const char* what, const char* file, int line);

// Where a kernel launch is checked (WEFT_CUDA_CHECK_LAUNCH). Messages and the
// WEFT_CUDA_SYNC_LAUNCHES mode: kernels/cuda/launch_diagnostics.h.
struct LaunchSite {
  const char* file;
  int line;

  // Checks the launch of `op`'s kernel on `stream` just made. With WEFT_CUDA_SYNC_LAUNCHES=1
  // it then waits for the stream and checks again, device-side errors included (Note
  // [Device-side errors]), so that a fault inside the kernel is reported here, by name.
  void check(const char* op, cudaStream_t stream) const;
  // For launches that name no op (the teaching ladders of kernels/dev/); that mode waits
  // for the whole device.
  void check() const;
};

// Whether launches are synchronised and checked: WEFT_CUDA_SYNC_LAUNCHES, read at the first
// launch, unless set_sync_launches() said otherwise (tests switch the mode for one case).
bool sync_launches();
void set_sync_launches(bool enabled);

}  // namespace weft::cuda

#define WEFT_CUDA_CHECK(expr) ::weft::cuda::check_status((expr), #expr, __FILE__, __LINE__)
// After every <<<...>>>: WEFT_CUDA_CHECK_LAUNCH("max_pool2d_backward", stream) names the op
// whose kernel it launched on `stream` (kernels/cuda/ always names it).
#define WEFT_CUDA_CHECK_LAUNCH(...) ::weft::cuda::LaunchSite{__FILE__, __LINE__}.check(__VA_ARGS__)
