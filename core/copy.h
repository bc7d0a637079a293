// The copy kernel that core itself needs (contiguous, clone, to, copy_).
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// dst[i] = convert(src[i]); src already has dst's shape (broadcast strides allowed) and,
// for this kernel, the same device type. Cross-device copies are split by the caller.
using CopyFn = void(const Tensor& src, const Tensor& dst);
extern DispatchStub<CopyFn> copy_stub;

// Value fill of every element of dst (any strides).
using FillFn = void(const Tensor& dst, double value);
extern DispatchStub<FillFn> fill_stub;

// Copies between two devices of different types (host <-> CUDA). Registered by the
// CUDA backend; both tensors contiguous with the same dtype and shape.
using CrossDeviceCopyFn = void(const Tensor& src, const Tensor& dst);
void register_cross_device_copy(CrossDeviceCopyFn* fn);
void cross_device_copy(const Tensor& src, const Tensor& dst);

}  // namespace weft

namespace weft {
// dst <- src without autograd: broadcasts src to dst's shape, converts dtype, crosses
// devices. Bumps dst's version.
void copy_values(const Tensor& dst, const Tensor& src);
}  // namespace weft
