// CUDA runtime: physical GPUs, logical devices, and the device guard.
//
// Discovery never fails: on a machine without a driver or GPU, device_count() is 0 and
// the reason is logged once; only asking for a CUDA tensor is an error. Logical device
// cuda:i runs on physical GPU plan[i]. By default there is one logical device per GPU;
// WEFT_VIRTUAL_DEVICES=N makes N logical devices mapped round-robin onto the GPUs, each
// with its own streams and allocator pool, so multi-device code runs for real on one GPU.
#pragma once

#include <string>

#include "core/device.h"

namespace weft::cuda {

int physical_device_count();  // 0 without a driver or GPU; never throws
int device_count();           // logical devices; throws only for a malformed WEFT_VIRTUAL_DEVICES
bool is_available();          // device_count() > 0; never throws
// Why is_available() is false ("" when it is true), for error messages.
const std::string& unavailable_reason();

// The physical GPU behind a logical CUDA device; a clear error for a CPU device or an
// index beyond device_count().
int physical_device(Device device);

// Makes device's GPU current on this thread for its lifetime, then restores the previous.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Waits for all work on every stream of the device (all of its physical GPU).
void synchronize(Device device);

// Whether TF32 tensor cores may be used for float32 matrix products (off by default, as
// in PyTorch since 1.12: results then match float32 to the usual tolerances).
bool allow_tf32();
void set_allow_tf32(bool allow);

}  // namespace weft::cuda
