// Device discovery, the logical-device plan and the device guard.
#include "kernels/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <iostream>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_plan.h"

namespace weft::cuda {

void check_status(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) [[likely]] return;
  cudaGetLastError();  // clear a sticky-free error so that the next call starts clean
  WEFT_FAIL("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") in ", what, " at ",
            file, ":", line);
}

namespace {

struct Discovery {
  int physical = 0;
  std::string reason;      // why no CUDA device can be used ("" when one can)
  std::vector<int> plan;   // logical -> physical
  std::string plan_error;  // a malformed WEFT_VIRTUAL_DEVICES, reported when devices are asked for
};

Discovery discover() {
  Discovery d;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    d.reason = std::string("no usable CUDA driver or GPU (cudaGetDeviceCount: ") + cudaGetErrorString(status) + ")";
  } else if (count == 0) {
    d.reason = "no CUDA GPU is visible";
  }
  d.physical = status == cudaSuccess ? count : 0;
  try {
    d.plan = plan_logical_devices(d.physical, std::getenv("WEFT_VIRTUAL_DEVICES"));
  } catch (const Error& e) {
    d.plan_error = e.what();
    if (d.reason.empty()) d.reason = d.plan_error;
  }
  if (!d.reason.empty()) std::cerr << "weft: CUDA: " << d.reason << "; CUDA devices are unavailable\n";
  return d;
}

const Discovery& discovery() {
  static const Discovery d = discover();
  return d;
}

std::atomic<bool> tf32_allowed{false};

}  // namespace

int physical_device_count() { return discovery().physical; }

int device_count() {
  const Discovery& d = discovery();
  WEFT_CHECK(d.plan_error.empty(), d.plan_error);
  return static_cast<int>(d.plan.size());
}

bool is_available() { return discovery().reason.empty() && !discovery().plan.empty(); }

const std::string& unavailable_reason() { return discovery().reason; }

int physical_device(Device device) {
  WEFT_CHECK(device.is_cuda(), "expected a CUDA device, got ", device);
  const Discovery& d = discovery();
  WEFT_CHECK(d.reason.empty(), "cannot use ", device, ": ", d.reason);
  int logical = static_cast<int>(d.plan.size());
  WEFT_CHECK(device.index < logical, "cannot use ", device, ": this process has ", logical,
             " logical CUDA device(s), cuda:0 .. cuda:", logical - 1, " on ", d.physical,
             " GPU(s); set WEFT_VIRTUAL_DEVICES=N for N logical devices mapped onto the GPUs");
  return d.plan[static_cast<size_t>(device.index)];
}

DeviceGuard::DeviceGuard(Device device) {
  int target = physical_device(device);
  WEFT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != target) WEFT_CUDA_CHECK(cudaSetDevice(target));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

void synchronize(Device device) {
  DeviceGuard guard(device);
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
}

bool allow_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }
void set_allow_tf32(bool allow) { tf32_allowed.store(allow, std::memory_order_relaxed); }

}  // namespace weft::cuda
