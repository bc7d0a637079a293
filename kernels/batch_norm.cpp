// batch_norm: argument checks, batch statistics and running-stat update, dispatch, and
// the backward node.
#include "kernels/batch_norm.h"

#include "core/autograd.h"
#include "kernels/batch_norm_kernels.h"
#include "kernels/checks.h"

namespace weft {

constinit DispatchStub<BatchNormStatsFn> batch_norm_stats_stub{"batch_norm stats"};
constinit DispatchStub<BatchNormForwardFn> batch_norm_forward_stub{"batch_norm"};
constinit DispatchStub<BatchNormBackwardFn> batch_norm_backward_stub{"batch_norm backward"};

namespace {

// A per-channel argument: undefined, or [C] with input's dtype and device.
void check_channel_tensor(const Tensor& input, const Tensor& t, const char* arg) {
  if (!t.defined()) return;
  WEFT_CHECK(t.dim() == 1 && t.size(0) == input.size(1), "batch_norm: expected '", arg, "' of shape [",
             input.size(1), "] (one value per channel of input ", input.shape(), "), got shape ", t.shape());
  check_same_dtype("batch_norm", input, t);
  check_same_device("batch_norm", {&input, &t});
}

// SavedTensor of a tensor that may be undefined.
SavedTensor save_optional(const Tensor& t) { return t.defined() ? SavedTensor(t) : SavedTensor(); }

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  check_defined(input, "batch_norm", "input");
  check_floating(input, "batch_norm");
  WEFT_CHECK(input.dim() >= 2, "batch_norm: expected input of shape [N, C] or [N, C, *], got shape ", input.shape());
  check_channel_tensor(input, running_mean, "running_mean");
  check_channel_tensor(input, running_var, "running_var");
  check_channel_tensor(input, weight, "weight");
  check_channel_tensor(input, bias, "bias");
  WEFT_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must be given together (both or neither)");
  WEFT_CHECK(training || running_mean.defined(),
             "batch_norm: running_mean and running_var are required in evaluation mode (training = false)");
  WEFT_CHECK(!any_requires_grad(running_mean, running_var),
             "batch_norm: running_mean and running_var are buffers and must not require grad");
  WEFT_CHECK(eps >= 0, "batch_norm: eps must be non-negative, got ", eps);

  const int64_t n = input.size(0), channels = input.size(1);
  int64_t spatial = 1;
  for (int64_t d = 2; d < input.dim(); ++d) spatial *= input.size(d);
  WEFT_CHECK(!training || n * spatial > 1, "batch_norm: expected more than 1 value per channel when training, got input shape ",
             input.shape());

  // The kernels see [N, C, S]; detach() keeps the storage (and its version) when input is
  // already contiguous, so the saved tensor still notices a later in-place write.
  Tensor x = input.detach().contiguous().view({n, channels, spatial});
  const TensorOptions options(input.dtype(), input.device());
  Tensor mean = running_mean, var = running_var;
  if (training) {
    mean = empty({channels}, options);
    var = empty({channels}, options);
    if (channels > 0) batch_norm_stats_stub(input.device(), x, mean, var, running_mean, running_var, momentum);
    if (running_mean.defined()) {
      running_mean.bump_version();
      running_var.bump_version();
    }
  }
  Tensor out = empty(input.shape(), options);
  if (out.numel() > 0)
    batch_norm_forward_stub(input.device(), x, mean, var, eps, weight, bias, out.view({n, channels, spatial}));

  if (any_requires_grad(input, weight, bias)) {
    set_history(out, make_node(
                         "BatchNormBackward",
                         [sx = SavedTensor(x), smean = SavedTensor(mean), svar = SavedTensor(var),
                          sweight = save_optional(weight), training, eps, shape = input.shape(),
                          need_input = input.requires_grad(), need_weight = weight.defined() && weight.requires_grad(),
                          need_bias = bias.defined() && bias.requires_grad()](const GradList& grads) -> GradList {
                           const Tensor& x = sx.unpack();
                           const Tensor& go = grads[0];
                           const TensorOptions opts(go.dtype(), go.device());
                           const int64_t c = x.size(1);
                           Tensor gi = need_input ? empty(shape, opts) : Tensor();
                           Tensor gw = need_weight ? empty({c}, opts) : Tensor();
                           Tensor gb = need_bias ? empty({c}, opts) : Tensor();
                           if (c > 0)
                             batch_norm_backward_stub(go.device(), go.contiguous().view(x.shape()), x, smean.unpack(),
                                                      svar.unpack(), eps, sweight.defined() ? sweight.unpack() : Tensor(),
                                                      training, need_input ? gi.view(x.shape()) : Tensor(), gw, gb);
                           return {gi, gw, gb};
                         },
                         input, weight, bias));
  }
  return out;
}

}  // namespace weft
