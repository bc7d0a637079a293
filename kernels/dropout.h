// Dropout with PyTorch's F.dropout semantics (weft has no inplace flag; the generator is
// an explicit, optional argument).
//
// In training, each element is zeroed with probability p and the survivors are scaled by
// 1 / (1 - p), so the expected value is unchanged. The mask comes from a Philox stream
// (rand() on `gen`, or the default generator of the input's device), so a seed
// reproduces it on any thread count. Returns input itself when !training, p == 0 or input is empty; p == 1 gives
// zeros. The backward multiplies the gradient by the same (saved) scaled mask.
#pragma once

#include "core/generator.h"
#include "core/tensor.h"

namespace weft {

Tensor dropout(const Tensor& input, double p = 0.5, bool training = true, Generator* gen = nullptr);

}  // namespace weft
