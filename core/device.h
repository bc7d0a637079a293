// Device: a small value type naming where a tensor lives.
//
// cuda:i is a *logical* device (WEFT_VIRTUAL_DEVICES maps several onto one GPU) and cpu:i
// is a logical host device: same RAM, separate allocator accounting. Logical CPU devices
// let every multi-device code path (DataParallel, pipelines) run and be tested on a
// machine with no GPU. See docs/design.md, "Devices".
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace weft {

enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int index_ = 0) : type(t), index(static_cast<int16_t>(index_)) {}
  // Parses "cpu", "cpu:2", "cuda", "cuda:1"; anything else throws weft::Error.
  explicit Device(std::string_view spec);

  static constexpr Device cpu(int index = 0) { return Device(DeviceType::CPU, index); }
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;

  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};

// Logical CPU devices are cheap (one allocator each); the bound keeps tables fixed-size.
constexpr int kMaxCpuDevices = 64;

std::ostream& operator<<(std::ostream& out, Device device);

// Whether CUDA devices can be used: a CUDA backend is built in and found a GPU. Never
// throws; a machine without a driver simply answers false.
bool cuda_available();
// Logical CUDA devices (cuda:0 .. cuda:N-1; WEFT_VIRTUAL_DEVICES can make several per
// GPU); 0 when cuda_available() is false.
int cuda_device_count();
// Physical GPUs behind them; 0 when cuda_available() is false.
int cuda_physical_device_count();
// Why cuda_available() is false ("" when it is true): no CUDA backend built, no driver,
// no GPU, a malformed WEFT_VIRTUAL_DEVICES.
const std::string& cuda_unavailable_reason();

}  // namespace weft
