// The kernels layer registers itself with core at static initialisation: the CPU kernel of
// every DispatchStub (kernels/cpu/backend.h) and the ops that core's autograd calls
// (core/gradient_ops.h). Core never calls into kernels/ by name (docs/design.md), so nothing
// would pull this object out of the static library: CMake links every program that uses
// weft with --undefined=weft_kernels_registered, the symbol below, which keeps it.
#include "core/gradient_ops.h"
#include "kernels/cpu/backend.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace weft {

namespace {

bool register_kernels() {
  cpu::register_kernels();
  register_gradient_ops(GradientOps{
      .add = [](const Tensor& a, const Tensor& b) { return add(a, b); },
      .accumulate = [](const Tensor& into, const Tensor& grad) { add_(into, grad); },
      .sum_to_shape = [](const Tensor& grad, const Shape& shape) { return sum_to_shape(grad, shape); },
  });
  return true;
}

}  // namespace

}  // namespace weft

extern "C" {
// The anchor the linker is told to keep; its initialiser does the registration.
extern const bool weft_kernels_registered;
const bool weft_kernels_registered = weft::register_kernels();
}
