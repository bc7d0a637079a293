// Kernel signatures of the pooling family, shared by the CPU and CUDA backends.
//
// Arguments arrive checked: `input` is 4-d [N, C, H, W] with any strides, float32 or
// float64; outputs are contiguous, allocated with the shape the geometry implies, and
// are written entirely (a backward kernel fills grad_input, zeros included). grad_out
// arrives contiguous. Every (n, c) plane is independent, which is how the kernels stay
// deterministic: one plane is written by one thread.
#pragma once

#include <array>
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// A window sweep over one dim pair {height, width}; stride already resolved (never 0).
struct Pool2dGeometry {
  std::array<int64_t, 2> kernel;
  std::array<int64_t, 2> stride;
  std::array<int64_t, 2> padding;
  std::array<int64_t, 2> dilation;
};

// out / indices: [N, C, OH, OW]; indices are int64 positions h * W + w in the plane.
using MaxPool2dFn = void(const Tensor& input, const Tensor& out, const Tensor& indices, const Pool2dGeometry& g);
// grad_input [N, C, H, W] = scatter-add of grad_out at indices.
using MaxPool2dBackwardFn = void(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_input);
using AvgPool2dFn = void(const Tensor& input, const Tensor& out, const Pool2dGeometry& g, bool count_include_pad);
using AvgPool2dBackwardFn = void(const Tensor& grad_out, const Tensor& grad_input, const Pool2dGeometry& g,
                                 bool count_include_pad);
// Window sizes come from the input and output shapes (see adaptive_avg_pool2d).
using AdaptiveAvgPool2dFn = void(const Tensor& input, const Tensor& out);
using AdaptiveAvgPool2dBackwardFn = void(const Tensor& grad_out, const Tensor& grad_input);

extern DispatchStub<MaxPool2dFn> max_pool2d_stub;
extern DispatchStub<MaxPool2dBackwardFn> max_pool2d_backward_stub;
extern DispatchStub<AvgPool2dFn> avg_pool2d_stub;
extern DispatchStub<AvgPool2dBackwardFn> avg_pool2d_backward_stub;
extern DispatchStub<AdaptiveAvgPool2dFn> adaptive_avg_pool2d_stub;
extern DispatchStub<AdaptiveAvgPool2dBackwardFn> adaptive_avg_pool2d_backward_stub;

}  // namespace weft
