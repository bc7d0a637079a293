// GradientOps: the three Tensor-level ops that core's autograd needs but cannot own.
//
// Accumulating gradients (into .grad, and where several consumers of one output deliver)
// and the backward of expand (sum back to the original shape) are ordinary ops with CPU
// and CUDA kernels, and those live in kernels/, above core. kernels/ registers them here
// at static initialisation (kernels/register_kernels.cpp), so that core calls nothing in
// kernels/ directly (docs/design.md's dependency order).
#pragma once

#include "core/shape.h"

namespace weft {

class Tensor;

struct GradientOps {
  Tensor (*add)(const Tensor& a, const Tensor& b);               // a + b, same shapes and devices
  void (*accumulate)(const Tensor& into, const Tensor& grad);    // into += grad, in place
  Tensor (*sum_to_shape)(const Tensor& grad, const Shape& shape);  // sums broadcast dims away
};

void register_gradient_ops(const GradientOps& ops);
// The registered ops; an error if kernels/ registered none (its object was not linked).
const GradientOps& gradient_ops();

}  // namespace weft
