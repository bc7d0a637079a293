// Kernel signature of the reduction family.
//
// `in` is contiguous and read as [outer, inner, post]: output element (o, p) reduces the
// `inner` values in[o, :, p]. The Tensor-level op picks the layout without copying when
// the reduced dims of a contiguous input are adjacent: trailing dims give rows (post == 1,
// each output reduces one contiguous row), leading or middle dims give columns (post > 1,
// e.g. the bias gradient sum over dim 0), which the kernel walks side by side instead of
// transposing. Any other case is permuted to rows and copied first.
//
// Every output element is reduced in one fixed order that depends only on the layout,
// never on the thread count (the CPU splits long rows into fixed-size blocks, reduced in
// parallel and folded in block order), so every kernel is deterministic.
#pragma once

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

enum class ReduceOp {
  Sum,     // integers accumulate in int64, floats in float64
  Mean,    // floating only; NaN for inner == 0
  Max,     // NaN propagates; inner > 0
  Min,
  ArgMax,  // out: int64 index (along inner) of the first maximum; a NaN counts as the maximum; inner > 0
  ArgMin,
  Var,     // floating only: two passes (mean, then squared deviations) / max(0, inner - correction)
};

// out has outer * post contiguous elements: in's dtype, or int64 for ArgMax / ArgMin. For
// ArgMax / ArgMin, `values` (when defined: outer * post contiguous elements of in's dtype)
// also receives the selected values. `correction` is used by Var only.
using ReduceFn = void(ReduceOp op, const Tensor& in, int64_t outer, int64_t inner, int64_t post, const Tensor& out,
                      const Tensor& values, double correction);
extern DispatchStub<ReduceFn> reduce_stub;

}  // namespace weft
