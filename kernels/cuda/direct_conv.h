// weft's own CUDA convolution: direct loops, one thread per element written.
//
// conv.cpp runs a pass with these kernels only where cuDNN offers no acceptable algorithm
// (conv_algorithm.h): in deterministic mode, a geometry for which cuDNN has no
// deterministic algorithm; in either mode, one for which it has none with FMA math or
// within the workspace limit. They favour being obviously right over speed: every output
// element is one sum in a fixed order (channels, then kernel rows, then kernel columns;
// for the weight gradient samples, then output rows, then output columns), with no atomics
// and no workspace, so the result is the same bits in every run.
//
// Operands are contiguous NCHW (input [n, channels, height, width], weight [out_channels,
// channels / groups, kh, kw], output [n, out_channels, out_h, out_w]) of float32 or
// float64, on `device`, and the kernels run on its current stream. No CUDA type appears
// here, so that the test_cuda_* suites can call the kernels directly.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/conv_kernels.h"

namespace weft::cuda {

struct DirectConvGeometry {
  int64_t n, channels, height, width;  // the input
  int64_t out_channels, out_h, out_w;  // the output
  int64_t kh, kw;                      // the kernel
  Conv2dParams params;
};

// y = conv(x, w), overwriting y.
void direct_conv2d_forward(DType dtype, const void* x, const void* w, void* y, const DirectConvGeometry& g,
                           Device device);
// dx = the input gradient of conv(x, w) for grad_out dy, overwriting dx.
void direct_conv2d_backward_input(DType dtype, const void* dy, const void* w, void* dx, const DirectConvGeometry& g,
                                  Device device);
// dw = the weight gradient for input x and grad_out dy, added to dw's values when
// `accumulate` (conv.cpp sums a batch's chunks so), else overwriting them.
void direct_conv2d_backward_weight(DType dtype, const void* x, const void* dy, void* dw, bool accumulate,
                                   const DirectConvGeometry& g, Device device);

}  // namespace weft::cuda
