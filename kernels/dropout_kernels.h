// Kernel signature of dropout, shared by the CPU and CUDA backends.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// mask arrives contiguous, holding uniforms in [0, 1) drawn by rand(); the kernel turns
// each into 0 (u < p) or 1 / (1 - p) in place and writes out = input * mask. input has
// mask's shape and dtype and any strides; out is contiguous; 0 < p < 1.
using DropoutFn = void(const Tensor& input, const Tensor& mask, const Tensor& out, double p);
extern DispatchStub<DropoutFn> dropout_stub;

}  // namespace weft
