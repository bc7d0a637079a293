// The list of filled DispatchStubs, and the error for a missing kernel.
#include "core/dispatch.h"

#include <mutex>

#include "core/device_backend.h"
#include "core/error.h"

namespace weft {

namespace {

struct StubList {
  std::mutex mutex;
  std::vector<const DispatchStubBase*> stubs;
};

// Made on first use: backends fill stubs from static initialisers.
StubList& stub_list() {
  static StubList* list = new StubList;
  return *list;
}

}  // namespace

void DispatchStubBase::mark_filled(DeviceType type) {
  StubList& list = stub_list();
  std::lock_guard lock(list.mutex);
  filled_[static_cast<int>(type)] = true;
  if (!listed_) {
    listed_ = true;
    list.stubs.push_back(this);
  }
}

std::vector<const DispatchStubBase*> all_dispatch_stubs() {
  StubList& list = stub_list();
  std::lock_guard lock(list.mutex);
  return list.stubs;
}

void DispatchStubBase::fail_no_kernel(Device device) const {
  if (device.is_cuda()) {
    const std::string& status = device_backend_status(DeviceType::CUDA);
    WEFT_CHECK(status.empty(), name_, " on ", device, ": ", status);
    WEFT_FAIL(name_, ": the CUDA backend has no kernel for this op (", device, ")");
  }
  WEFT_FAIL(name_, ": no CPU kernel is registered (the kernels layer's kernels/register_kernels.cpp was not "
            "linked; link with -Wl,--undefined=weft_kernels_registered)");
}

}  // namespace weft
