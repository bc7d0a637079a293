// DispatchStub: one declared kernel signature, one implementation per device type.
//
// The Tensor-level op checks its arguments, then calls stub(device, args...). The CPU
// implementation is set where the stub is defined (so the linker always keeps it); the
// CUDA backend fills in its entries when it starts. An op with no kernel for a device
// says so, naming the op and the device.
#pragma once

#include <utility>

#include "core/device.h"

namespace weft {

[[noreturn]] void fail_no_kernel(const char* op, Device device);

template <class Signature>
class DispatchStub;

template <class R, class... Args>
class DispatchStub<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  constexpr DispatchStub(const char* name, Fn cpu) : name_(name), table_{cpu, nullptr} {}

  void set(DeviceType type, Fn fn) { table_[static_cast<int>(type)] = fn; }
  bool has(DeviceType type) const { return table_[static_cast<int>(type)] != nullptr; }

  template <class... CallArgs>
  R operator()(Device device, CallArgs&&... args) const {
    Fn fn = table_[static_cast<int>(device.type)];
    if (!fn) [[unlikely]] fail_no_kernel(name_, device);
    return fn(std::forward<CallArgs>(args)...);
  }

 private:
  const char* name_;
  Fn table_[kNumDeviceTypes];
};

}  // namespace weft
