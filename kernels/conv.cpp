// conv2d: argument checks, output size, and the one backward node.
//
// The kernels see contiguous 4-d tensors only: an unbatched input is viewed as a batch
// of one, and non-contiguous operands are copied here (a conv reads its input kH * kW
// times, so one copy up front is cheap next to strided reads in the kernel).
#include "kernels/conv.h"

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/conv_kernels.h"

namespace weft {

constinit DispatchStub<Conv2dForwardFn> conv2d_forward_stub{"conv2d"};
constinit DispatchStub<Conv2dBackwardFn> conv2d_backward_stub{"conv2d backward"};

namespace {

int64_t output_size(int64_t in, int64_t k, int64_t stride, int64_t padding, int64_t dilation) {
  return (in + 2 * padding - dilation * (k - 1) - 1) / stride + 1;
}

void check_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  const char* op = "conv2d";
  check_defined(input, op, "input");
  check_defined(weight, op, "weight");
  if (bias.defined()) check_same_device(op, {&input, &weight, &bias});
  else check_same_device(op, {&input, &weight});
  check_same_dtype(op, input, weight);
  if (bias.defined()) check_same_dtype(op, input, bias);
  check_floating(input, op);
  WEFT_CHECK(input.dim() == 3 || input.dim() == 4, "conv2d: expected a 4-d input [N, C, H, W] or a 3-d unbatched "
             "input [C, H, W], got shape ", input.shape());
  WEFT_CHECK(weight.dim() == 4, "conv2d: expected a 4-d weight [out_channels, in_channels / groups, kH, kW], got "
             "shape ", weight.shape());
  for (int i = 0; i < 2; ++i) {
    WEFT_CHECK(p.stride[i] > 0, "conv2d: stride must be positive, got [", p.stride[0], ", ", p.stride[1], "]");
    WEFT_CHECK(p.padding[i] >= 0, "conv2d: padding must be non-negative, got [", p.padding[0], ", ", p.padding[1],
               "]");
    WEFT_CHECK(p.dilation[i] > 0, "conv2d: dilation must be positive, got [", p.dilation[0], ", ", p.dilation[1],
               "]");
  }
  WEFT_CHECK(p.groups > 0, "conv2d: groups must be positive, got ", p.groups);
  const int64_t out_channels = weight.size(0), channels = input.size(-3);
  WEFT_CHECK(out_channels > 0 && weight.size(1) > 0, "conv2d: weight shape ", weight.shape(), " has no channels");
  WEFT_CHECK(out_channels % p.groups == 0, "conv2d: out_channels ", out_channels, " (weight shape ", weight.shape(),
             ") is not divisible by groups ", p.groups);
  WEFT_CHECK(channels == weight.size(1) * p.groups, "conv2d: input shape ", input.shape(), " has ", channels,
             " channels, but weight shape ", weight.shape(), " with groups ", p.groups, " expects ",
             weight.size(1) * p.groups, " (weight.size(1) * groups)");
  if (bias.defined())
    WEFT_CHECK(bias.dim() == 1 && bias.size(0) == out_channels, "conv2d: expected bias of shape [", out_channels,
               "] for weight shape ", weight.shape(), ", got ", bias.shape());
  for (int i = 0; i < 2; ++i) {
    const int64_t padded = input.size(-2 + i) + 2 * p.padding[i];
    const int64_t extent = p.dilation[i] * (weight.size(2 + i) - 1) + 1;
    WEFT_CHECK(extent <= padded, "conv2d: kernel size ", weight.size(2), "x", weight.size(3), " (dilated extent ",
               extent, " in dim ", i, ") is larger than the padded input (", padded, "), input shape ",
               input.shape(), ", padding [", p.padding[0], ", ", p.padding[1], "]");
  }
}

// As a contiguous [N, C, H, W] tensor without autograd history.
Tensor batched(const Tensor& x) {
  Tensor t = x.detach().contiguous();
  return t.dim() == 3 ? t.unsqueeze(0) : t;
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  const Conv2dParams params{stride, padding, dilation, groups};
  check_conv2d(input, weight, bias, params);

  const Tensor x = batched(input);
  const int64_t n = x.size(0), out_channels = weight.size(0);
  const int64_t oh = output_size(x.size(2), weight.size(2), stride[0], padding[0], dilation[0]);
  const int64_t ow = output_size(x.size(3), weight.size(3), stride[1], padding[1], dilation[1]);
  Shape shape = input.dim() == 3 ? Shape{out_channels, oh, ow} : Shape{n, out_channels, oh, ow};
  Tensor out = empty(shape, TensorOptions(input.dtype(), input.device()));
  if (n > 0) {
    conv2d_forward_stub(input.device(), x, weight.detach().contiguous(),
                        bias.defined() ? bias.detach().contiguous() : Tensor(), out.view({n, out_channels, oh, ow}),
                        params);
  }

  if (any_requires_grad(input, weight, bias)) {
    set_history(out, make_node(
                         "Conv2dBackward",
                         [sx = SavedTensor(input), sw = SavedTensor(weight), params,
                          need_input = input.requires_grad(), need_weight = weight.requires_grad(),
                          need_bias = bias.defined() && bias.requires_grad()](const GradList& g) -> GradList {
                           const Tensor& input = sx.unpack();
                           const Tensor& weight = sw.unpack();
                           const Tensor x = batched(input);
                           const TensorOptions options(x.dtype(), x.device());
                           if (x.size(0) == 0)
                             return {need_input ? zeros(input.shape(), options) : Tensor(),
                                     need_weight ? zeros(weight.shape(), options) : Tensor(),
                                     need_bias ? zeros({weight.size(0)}, options) : Tensor()};
                           Tensor gi = need_input ? empty(x.shape(), options) : Tensor();
                           Tensor gw = need_weight ? empty(weight.shape(), options) : Tensor();
                           Tensor gb = need_bias ? empty({weight.size(0)}, options) : Tensor();
                           conv2d_backward_stub(x.device(), batched(g[0]), x, weight.detach().contiguous(), gi, gw,
                                                gb, params);
                           return {gi.defined() ? gi.view(input.shape()) : Tensor(), gw, gb};
                         },
                         input, weight, bias));
  }
  return out;
}

}  // namespace weft
