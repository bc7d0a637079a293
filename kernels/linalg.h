// Matrix products: matmul (torch.matmul's rank rules and batch broadcasting), mm, bmm,
// and linear (F.linear).
//
// All take float32 or float64 operands of one dtype on one device (weft does not
// promote). Operands may be any strided view: a transposed matrix is read in place, not
// copied. The backward of each is one node whose gradients are products again
// (grad_a = g @ b^T, grad_b = a^T @ g), summed back over broadcast batch dims.
#pragma once

#include "core/tensor.h"

namespace weft {

// torch.matmul:
//   1-d x 1-d  -> 0-d dot product
//   2-d x 2-d  -> matrix product
//   1-d x n-d  -> a 1 is prepended to a, then removed from the result
//   n-d x 1-d  -> a 1 is appended to b, then removed from the result
//   batched    -> all dims but the last two are batch dims and broadcast
//                 ([2, 1, 3, 4] x [5, 4, 6] -> [2, 5, 3, 6])
Tensor matmul(const Tensor& a, const Tensor& b);

// torch.mm: [m, k] x [k, n] -> [m, n], 2-d operands only.
Tensor mm(const Tensor& a, const Tensor& b);

// torch.bmm: [B, m, k] x [B, k, n] -> [B, m, n], same batch size, no broadcasting.
Tensor bmm(const Tensor& a, const Tensor& b);

// F.linear: input [..., in] (1-d allowed), weight [out, in], bias [out] (may be
// undefined) -> [..., out] = input @ weight^T + bias. weight^T is never copied, forward
// or backward.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace weft
