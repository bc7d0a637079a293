// DeviceBackend: what core needs from the backend of a device type.
//
// core/ knows nothing of CUDA (docs/design.md): memory, streams, events and copies to and from
// the host reach a device type through this interface (PyTorch's DeviceGuardImplInterface
// plays the same part). Core implements it for CPU devices itself; kernels/cuda/backend.cpp
// implements it for CUDA devices and registers it at static initialisation. A static
// library would drop that object, since nothing calls into it: the build links every
// program with the linker option --undefined=weft_cuda_backend_registered, which keeps it
// (CMakeLists.txt). Without that registration (a CPU-only build) CUDA devices are refused
// with the reason.
//
// A backend is started once, on first need (the first CUDA tensor, or cuda_available()):
// start() finds the devices and, when there are any, fills its entries of every
// DispatchStub. Handles of streams and events are opaque here (void*).
#pragma once

#include <string>

#include "core/allocator.h"
#include "core/device.h"

namespace weft {

class Tensor;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual DeviceType type() const = 0;

  // Called once, before anything else: "" when the devices can be used, else why not
  // (no driver, no GPU, ...). Must not throw.
  virtual std::string start() = 0;
  // Logical devices of this type, and the physical ones behind them.
  virtual int device_count() = 0;
  virtual int physical_device_count() { return device_count(); }

  virtual Allocator& allocator(Device device) = 0;
  // Page-locked host memory that this backend copies from asynchronously (none: nullptr).
  virtual Allocator* pinned_allocator() { return nullptr; }
  // Copies between a device of this type and host memory: both tensors contiguous, one
  // dtype and shape (core stages the rest).
  virtual void copy_with_host(const Tensor& src, const Tensor& dst) = 0;

  // --- streams and events (core/stream.h) -------------------------------------------
  virtual void* default_stream(Device device) = 0;
  virtual void* upload_stream(Device device) = 0;
  virtual void* new_stream(Device device) = 0;
  virtual void synchronize_stream(Device device, void* stream) = 0;
  virtual bool query_stream(Device device, void* stream) = 0;
  virtual void synchronize_device(Device device) = 0;
  // An event is created on `device` the first time it is recorded.
  virtual void* create_event(Device device, bool timing) = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  virtual void record_event(void* event, Device device, void* stream) = 0;
  virtual void block_on_event(void* event, Device device, void* stream) = 0;
  virtual bool query_event(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual float elapsed_ms(void* start, void* end) = 0;
  virtual void record_stream(const Tensor& t, Device device, void* stream) = 0;
};

// Called by a backend at static initialisation; a second backend for one type is an error.
void register_device_backend(DeviceBackend& backend);

// The started backend of the device's type; throws, naming the device and the reason,
// when it cannot be used (backend not built, no driver, no GPU).
DeviceBackend& device_backend(Device device);
// "" when devices of `type` can be used, else why not. Starts the backend; never throws.
const std::string& device_backend_status(DeviceType type);

}  // namespace weft
