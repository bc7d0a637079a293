// The registry of collective libraries; see device_communicator.h.
#include "kernels/device_communicator.h"

#include <array>
#include <atomic>

#include "core/error.h"

namespace weft {

namespace {

const char* type_name(DeviceType type) { return type == DeviceType::CUDA ? "cuda" : "cpu"; }

std::array<std::atomic<CollectiveLibrary*>, kNumDeviceTypes>& registry() {
  static std::array<std::atomic<CollectiveLibrary*>, kNumDeviceTypes> libraries{};
  return libraries;
}

}  // namespace

void register_collective_library(CollectiveLibrary& library) {
  CollectiveLibrary* expected = nullptr;
  const auto type = static_cast<size_t>(library.type());
  WEFT_CHECK(registry()[type].compare_exchange_strong(expected, &library), "register_collective_library: ",
             expected ? expected->name() : "", " is already the collective library of ", type_name(library.type()),
             " devices; ", library.name(), " cannot be a second");
}

CollectiveLibrary& collective_library(DeviceType type) {
  CollectiveLibrary* library = registry()[static_cast<size_t>(type)].load();
  WEFT_CHECK(library != nullptr, "no collective library for ", type_name(type), " devices: ",
             type == DeviceType::CUDA ? "weft was built without NCCL (CMake found no nccl.h and libnccl; "
                                        "point NCCL_ROOT at them)"
                                      : "none exists");
  return *library;
}

bool has_collective_library(DeviceType type) { return registry()[static_cast<size_t>(type)].load() != nullptr; }

}  // namespace weft
