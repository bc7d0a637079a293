// Kernel signatures of the softmax family, shared by the CPU and CUDA backends.
//
// Every tensor arrives contiguous, floating, on one device, and is read as
// [outer, n, post]: the softmax runs along the middle dim (length n >= 1, stride post)
// for each of the outer * post positions. A softmax along the last dim is post == 1;
// along an inner dim of NCHW-like data the kernel walks post columns side by side
// instead of transposing.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// out = softmax(in) or, with log, log_softmax(in).
using SoftmaxFn = void(const Tensor& in, const Tensor& out, int64_t outer, int64_t n, int64_t post, bool log);
// grad_in = out * (grad - sum(grad * out)) or, with log, grad - exp(out) * sum(grad).
using SoftmaxBackwardFn = void(const Tensor& grad, const Tensor& out, const Tensor& grad_in, int64_t outer,
                               int64_t n, int64_t post, bool log);

extern DispatchStub<SoftmaxFn> softmax_stub;
extern DispatchStub<SoftmaxBackwardFn> softmax_backward_stub;

}  // namespace weft
