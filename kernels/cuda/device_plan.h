// The map from logical CUDA devices to physical GPUs (docs/design.md, "Devices").
//
// Pure, so that it is tested on machines without a GPU: runtime.cpp applies it to the
// GPUs it finds and to the WEFT_VIRTUAL_DEVICES variable.
#pragma once

#include <vector>

namespace weft::cuda {

// Bounded so that per-device tables (streams, allocators) stay fixed-size.
constexpr int kMaxLogicalDevices = 64;

// Logical device i runs on GPU plan[i]: one logical device per GPU by default, or
// `virtual_devices` (the value of WEFT_VIRTUAL_DEVICES; nullptr or "" when unset) logical
// devices mapped round-robin onto the GPUs. No GPU gives an empty plan. A malformed value
// throws weft::Error naming the variable and what it accepts.
std::vector<int> plan_logical_devices(int physical, const char* virtual_devices);

}  // namespace weft::cuda
