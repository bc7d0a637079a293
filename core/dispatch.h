// DispatchStub: one declared kernel signature, one implementation per device type.
//
// The Tensor-level op checks its arguments, then calls stub(device, args...). A stub is
// defined next to its op, empty and constant-initialised (constinit), and every backend
// fills its own entries with set(): the CPU kernels at static initialisation
// (kernels/cpu/backend.cpp), the CUDA kernels when the CUDA backend starts
// (kernels/cuda/backend.cpp). Because the stub is constant-initialised, set() may run in
// any static initialiser, in any order. The first set() adds the stub to a list of all
// stubs (all_dispatch_stubs()), which lets a test check that every backend fills every
// stub. An op with no kernel for a device says why, naming the op and the device.
#pragma once

#include <utility>
#include <vector>

#include "core/device.h"

namespace weft {

class DispatchStubBase {
 public:
  constexpr explicit DispatchStubBase(const char* name) : name_(name) {}
  const char* name() const { return name_; }
  bool has(DeviceType type) const { return filled_[static_cast<int>(type)]; }

 protected:
  void mark_filled(DeviceType type);
  [[noreturn]] void fail_no_kernel(Device device) const;

 private:
  const char* name_;
  bool filled_[kNumDeviceTypes] = {};
  bool listed_ = false;
};

// Every stub that some backend has filled, in the order they were first filled.
std::vector<const DispatchStubBase*> all_dispatch_stubs();

template <class Signature>
class DispatchStub;

template <class R, class... Args>
class DispatchStub<R(Args...)> : public DispatchStubBase {
 public:
  using Fn = R (*)(Args...);

  constexpr explicit DispatchStub(const char* name) : DispatchStubBase(name) {}

  void set(DeviceType type, Fn fn) {
    table_[static_cast<int>(type)] = fn;
    mark_filled(type);
  }

  template <class... CallArgs>
  R operator()(Device device, CallArgs&&... args) const {
    Fn fn = table_[static_cast<int>(device.type)];
    if (!fn) [[unlikely]] fail_no_kernel(device);
    return fn(std::forward<CallArgs>(args)...);
  }

 private:
  Fn table_[kNumDeviceTypes] = {};
};

}  // namespace weft
