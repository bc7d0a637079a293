// Kernel signature of the reduction family.
//
// `in` is read as [outer, inner]: the caller has permuted the reduced dims last and
// made the tensor contiguous, so every output element reduces one contiguous row of
// `inner` values. Rows are independent, which makes the kernel deterministic for any
// thread count (each row is summed in one fixed order).
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

enum class ReduceOp { Sum, Mean, Max, Min, ArgMax, Var };

// out has `outer` elements (dtype: in's, or int64 for ArgMax). `correction` is used by Var.
using ReduceFn = void(ReduceOp op, const Tensor& in, int64_t outer, int64_t inner, const Tensor& out,
                      double correction);
extern DispatchStub<ReduceFn> reduce_stub;

}  // namespace weft
