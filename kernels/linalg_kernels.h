// Kernel signature of the matrix-product family, shared by the CPU and CUDA backends.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// out[..., m, n] = a[..., m, k] @ b[..., k, n], or += when `accumulate` is set.
//
// Arguments arrive checked: one floating dtype, one device, equal batch dims (all but
// the last two) in all three tensors. a and b may have any strides, including stride 0
// on broadcast batch dims and a transposed layout in the last two dims. Any size may be
// 0 (k == 0 gives zeros). out is contiguous and does not overlap a or b. The result must
// not depend on the number of threads.
using MatmulFn = void(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate);
extern DispatchStub<MatmulFn> matmul_stub;

}  // namespace weft
