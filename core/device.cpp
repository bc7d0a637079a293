// Device parsing and printing.
#include "core/device.h"

#include <charconv>
#include <ostream>

#include "core/error.h"

namespace weft {

namespace {

int parse_index(std::string_view spec, std::string_view digits) {
  int value = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  WEFT_CHECK(!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() && value >= 0 &&
                 value < 32768,
             "invalid device '", spec, "': the index after ':' must be a non-negative integer");
  return value;
}

}  // namespace

Device::Device(std::string_view spec) {
  std::string_view kind = spec;
  int idx = 0;
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    kind = spec.substr(0, colon);
    idx = parse_index(spec, spec.substr(colon + 1));
  }
  if (kind == "cpu") {
    WEFT_CHECK(idx < kMaxCpuDevices, "invalid device '", spec, "': logical CPU devices are cpu:0 .. cpu:",
               kMaxCpuDevices - 1);
    type = DeviceType::CPU;
  } else if (kind == "cuda") {
    type = DeviceType::CUDA;
  } else {
    WEFT_FAIL("invalid device '", spec, "': expected cpu, cpu:N, cuda or cuda:N");
  }
  index = static_cast<int16_t>(idx);
}

std::string Device::str() const { return std::string(is_cpu() ? "cpu:" : "cuda:") + std::to_string(index); }

std::ostream& operator<<(std::ostream& out, Device device) { return out << device.str(); }

}  // namespace weft
