// The logical -> physical device plan (see device_plan.h). Plain C++: no CUDA here.
#include "kernels/cuda/device_plan.h"

#include <charconv>
#include <string_view>

#include "core/error.h"

namespace weft::cuda {

std::vector<int> plan_logical_devices(int physical, const char* virtual_devices) {
  int logical = physical;
  if (virtual_devices != nullptr && *virtual_devices != '\0') {
    std::string_view text(virtual_devices);
    int value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    WEFT_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= 1 && value <= kMaxLogicalDevices,
               "WEFT_VIRTUAL_DEVICES='", text, "': expected a whole number of logical CUDA devices from 1 to ",
               kMaxLogicalDevices);
    logical = physical > 0 ? value : 0;
  }
  std::vector<int> plan(static_cast<size_t>(logical));
  for (int i = 0; i < logical; ++i) plan[static_cast<size_t>(i)] = i % physical;
  return plan;
}

}  // namespace weft::cuda
