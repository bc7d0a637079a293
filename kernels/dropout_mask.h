// Dropout's mask rule: which uniforms keep their element, and the scale a kept element
// gets.
//
// Shared by kernels/cpu/dropout.cpp and kernels/cuda/dropout.cu: from the same uniforms
// (one generator state, kernels/random_transforms.h) both devices must keep the same
// elements and write the same bits, and the rule is where they could disagree (a
// threshold rounded the other way keeps one more or one fewer element).
#pragma once

#include <cmath>
#include <limits>

#include "core/host_device.h"

namespace weft {

template <class T>
struct DropoutMask {
  // u >= threshold exactly when u >= p, for every u of type T: the smallest T not below
  // p, so the comparison runs in T (float32 vector lanes on the CPU) and still keeps
  // what a comparison in double would.
  T threshold;
  T scale;  // 1 / (1 - p), rounded to T once

  // Host only (std::nextafter); 0 < p < 1.
  static DropoutMask for_probability(double p) {
    T t = static_cast<T>(p);
    if (static_cast<double>(t) < p) t = std::nextafter(t, std::numeric_limits<T>::infinity());
    return {t, static_cast<T>(1.0 / (1.0 - p))};
  }

  // The mask value for uniform u in [0, 1): 0 (dropped, u < p) or the scale. A select,
  // not a branch: which elements survive is random, and the CPU loop vectorises it.
  WEFT_HOST_DEVICE T operator()(T u) const { return u >= threshold ? scale : T(0); }
};

}  // namespace weft
