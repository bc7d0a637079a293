// softmax and log_softmax along one dim, as torch.softmax / torch.log_softmax.
//
// Numerically stable (the row maximum is subtracted before exp), along any dim, float32
// or float64 (weft does not take PyTorch's optional dtype argument: convert first). Both
// run as dedicated forward and backward kernels rather than as compositions of exp, sum
// and div, so each costs one read and one write of the tensor (plus the max pass).
#pragma once

#include "core/tensor.h"

namespace weft {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// The fused gradients, for layers that save the output themselves:
// softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g), sums along dim.
Tensor softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim);

}  // namespace weft
