// The copy kernels that core itself needs (contiguous, clone, to, copy_).
//
// The stubs are core's; their kernels come from the backends (kernels/cpu/copy.cpp,
// kernels/cuda/copy.cu), like every other op's. Copies between device types (host and
// CUDA) go through the device's backend (DeviceBackend::copy_with_host).
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// dst[i] = convert(src[i]); src already has dst's shape (broadcast strides allowed) and,
// for this kernel, the same device type. Copies across device types are split by the caller.
using CopyFn = void(const Tensor& src, const Tensor& dst);
extern DispatchStub<CopyFn> copy_stub;

// Value fill of every element of dst (any strides).
using FillFn = void(const Tensor& dst, double value);
extern DispatchStub<FillFn> fill_stub;

// dst <- src without autograd: broadcasts src to dst's shape, converts dtype, crosses
// devices. Bumps dst's version.
void copy_values(const Tensor& dst, const Tensor& src);

}  // namespace weft
