// WEFT_CUDA_CHECK_LAUNCH: the check after every kernel launch, and the
// WEFT_CUDA_SYNC_LAUNCHES mode (messages and parsing: launch_diagnostics.h).
#include <atomic>
#include <cstdlib>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_error.h"
#include "kernels/cuda/launch_diagnostics.h"

namespace weft::cuda {

namespace {

[[noreturn]] void fail_launch(cudaError_t status, const char* op, const LaunchSite& site, bool after_sync) {
  cudaGetLastError();  // clear a non-sticky error, so that the next call starts clean
  throw Error(launch_failure_message(op, cudaGetErrorName(status), cudaGetErrorString(status), site.file, site.line,
                                     after_sync, sync_launches()));
}

// In WEFT_CUDA_SYNC_LAUNCHES mode, after the launch checked out: wait for the kernel, then
// check what it did (a fault, a device-side error record).
void check_after_sync(cudaError_t waited, const char* op, const LaunchSite& site) {
  if (waited != cudaSuccess) fail_launch(waited, op, site, true);
  raise_pending_device_error();
}

}  // namespace

namespace {
std::atomic<int> sync_mode{-1};  // -1: the variable not read yet, else 0 or 1
}  // namespace

bool sync_launches() {
  int mode = sync_mode.load(std::memory_order_relaxed);
  if (mode < 0) {  // threads racing here read the same variable and store the same value
    mode = parse_sync_launches(std::getenv("WEFT_CUDA_SYNC_LAUNCHES")) ? 1 : 0;
    sync_mode.store(mode, std::memory_order_relaxed);
  }
  return mode == 1;
}

void set_sync_launches(bool enabled) { sync_mode.store(enabled ? 1 : 0, std::memory_order_relaxed); }

void LaunchSite::check(const char* op, cudaStream_t stream) const {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) [[unlikely]] fail_launch(status, op, *this, false);
  if (sync_launches()) [[unlikely]] check_after_sync(cudaStreamSynchronize(stream), op, *this);
}

void LaunchSite::check() const {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) [[unlikely]] fail_launch(status, "", *this, false);
  if (sync_launches()) [[unlikely]] check_after_sync(cudaDeviceSynchronize(), "", *this);
}

}  // namespace weft::cuda
