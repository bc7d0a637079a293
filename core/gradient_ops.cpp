// The slot kernels/ fills with the ops core's autograd calls.
#include "core/gradient_ops.h"

#include "core/error.h"

namespace weft {

namespace {
// Constant-initialised (all null), so registration may run in any static initialiser.
constinit GradientOps registered{};
}  // namespace

void register_gradient_ops(const GradientOps& ops) { registered = ops; }

const GradientOps& gradient_ops() {
  WEFT_CHECK(registered.add != nullptr, "autograd: no gradient ops are registered (the kernels layer's "
             "kernels/register_kernels.cpp was not linked; link with -Wl,--undefined=weft_kernels_registered)");
  return registered;
}

}  // namespace weft
