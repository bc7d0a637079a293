// softmax / log_softmax: checks, the [outer, n, post] layout, and backward.
#include "kernels/softmax.h"

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/softmax_kernels.h"

namespace weft {

constinit DispatchStub<SoftmaxFn> softmax_stub{"softmax"};
constinit DispatchStub<SoftmaxBackwardFn> softmax_backward_stub{"softmax_backward"};

namespace {

Tensor backward_impl(const Tensor& grad, const Tensor& output, int64_t dim, bool log, const char* name) {
  check_defined(grad, name, "grad");
  check_defined(output, name, "output");
  check_floating(output, name);
  check_same_dtype(name, grad, output);
  check_same_device(name, {&grad, &output});
  WEFT_CHECK(grad.shape() == output.shape(), name, ": grad shape ", grad.shape(), " does not match output shape ",
             output.shape());
  WEFT_CHECK(!any_requires_grad(grad, output), name,
             ": records no gradient of its own (call it on detached tensors or under NoGradGuard)");
  int64_t d = wrap_dim(dim, output.dim(), name);
  Tensor g = grad.contiguous(), y = output.contiguous();
  Tensor grad_in = empty(output.shape(), TensorOptions(output.dtype(), output.device()));
  DimSplit l = split_at_dim(output.shape(), d);
  if (grad_in.numel() > 0) softmax_backward_stub(output.device(), g, y, grad_in, l.outer, l.size, l.inner, log);
  return grad_in;
}

Tensor forward_impl(const Tensor& x, int64_t dim, bool log, const char* name, const char* node_name) {
  check_defined(x, name, "input");
  check_floating(x, name);
  int64_t d = wrap_dim(dim, x.dim(), name);
  Tensor in;
  {
    NoGradGuard no_grad;
    in = x.contiguous();
  }
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  DimSplit l = split_at_dim(x.shape(), d);
  if (out.numel() > 0) softmax_stub(x.device(), in, out, l.outer, l.size, l.inner, log);
  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         node_name,
                         [so = SavedTensor(out, true), d, log](const GradList& g) -> GradList {
                           return {backward_impl(g[0], so.unpack(), d, log,
                                                 log ? "log_softmax_backward" : "softmax_backward")};
                         },
                         x));
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return forward_impl(x, dim, false, "softmax", "SoftmaxBackward"); }

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return forward_impl(x, dim, true, "log_softmax", "LogSoftmaxBackward");
}

Tensor softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim) {
  return backward_impl(grad, output, dim, false, "softmax_backward");
}

Tensor log_softmax_backward(const Tensor& grad, const Tensor& output, int64_t dim) {
  return backward_impl(grad, output, dim, true, "log_softmax_backward");
}

}  // namespace weft
