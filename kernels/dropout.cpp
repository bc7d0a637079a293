// dropout: argument checks, the mask draw, and the backward through the saved mask.
#include "kernels/dropout.h"

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/dropout_kernels.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"

namespace weft {

constinit DispatchStub<DropoutFn> dropout_stub{"dropout"};

Tensor dropout(const Tensor& input, double p, bool training, Generator* gen) {
  check_defined(input, "dropout", "input");
  check_floating(input, "dropout");
  WEFT_CHECK(p >= 0 && p <= 1, "dropout: probability p must be in [0, 1], got ", p);
  if (!training || p == 0 || input.numel() == 0) return input;
  // Everything is dropped: multiplying by zero (rather than returning fresh zeros) keeps
  // the graph and NaN behaviour of PyTorch.
  if (p == 1) return mul(input, 0.0);

  // The uniforms become the scaled mask in place: one extra tensor, kept for backward.
  Tensor mask = rand(input.shape(), TensorOptions(input.dtype(), input.device()), gen);
  Tensor out = empty(input.shape(), TensorOptions(input.dtype(), input.device()));
  dropout_stub(input.device(), input, mask, out, p);
  if (any_requires_grad(input)) {
    set_history(out, make_node(
                         "DropoutBackward",
                         [sm = SavedTensor(mask)](const GradList& g) -> GradList { return {mul(g[0], sm.unpack())}; },
                         input));
  }
  return out;
}

}  // namespace weft
