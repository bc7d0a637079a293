// Reductions over any set of dims, with keepdim.
//
// An empty dim list means every dim. Sums of float32 accumulate in float64 on the CPU.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace weft {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// Sums `x` down to `shape` (the inverse of broadcasting `shape` up to x's shape): the
// gradient of every broadcasting op goes through this.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

}  // namespace weft
