// Kernel signatures of the convolution family, shared by the CPU and CUDA backends.
//
// Arguments arrive checked and contiguous: input [N, C, H, W], weight [O, C / groups,
// kH, kW], bias [O] (undefined: none), out / grad_out [N, O, OH, OW] with OH, OW from
// the usual formula and at least 1, N >= 1, one floating dtype, one device. Outputs are
// written, not accumulated. Results must not depend on the number of threads.
#pragma once

#include <array>
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

using Conv2dForwardFn = void(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                             const Conv2dParams& params);

// Each of grad_input [N, C, H, W], grad_weight (weight's shape) and grad_bias [O] is
// either undefined (not needed, not computed) or a contiguous tensor to fill.
using Conv2dBackwardFn = void(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                              const Tensor& grad_input, const Tensor& grad_weight, const Tensor& grad_bias,
                              const Conv2dParams& params);

extern DispatchStub<Conv2dForwardFn> conv2d_forward_stub;
extern DispatchStub<Conv2dBackwardFn> conv2d_backward_stub;

}  // namespace weft
