// Pooling ops: geometry checks (PyTorch's rules and output sizes), dispatch, backward.
//
// The ops work on 4-d inputs; a 3-d [C, H, W] input goes through unsqueeze(0) /
// squeeze(0), which are differentiable views, so autograd needs no special case.
#include "kernels/pooling.h"

#include <string>
#include <type_traits>

#include "core/autograd.h"
#include "kernels/checks.h"
#include "kernels/pooling_kernels.h"

namespace weft {

constinit DispatchStub<MaxPool2dFn> max_pool2d_stub{"max_pool2d"};
constinit DispatchStub<MaxPool2dBackwardFn> max_pool2d_backward_stub{"max_pool2d backward"};
constinit DispatchStub<AvgPool2dFn> avg_pool2d_stub{"avg_pool2d"};
constinit DispatchStub<AvgPool2dBackwardFn> avg_pool2d_backward_stub{"avg_pool2d backward"};
constinit DispatchStub<AdaptiveAvgPool2dFn> adaptive_avg_pool2d_stub{"adaptive_avg_pool2d"};
constinit DispatchStub<AdaptiveAvgPool2dBackwardFn> adaptive_avg_pool2d_backward_stub{"adaptive_avg_pool2d backward"};

namespace {

using Pair = std::array<int64_t, 2>;

std::string pair_str(Pair p) { return detail::concat("{", p[0], ", ", p[1], "}"); }

void check_pool_input(const Tensor& input, const char* op) {
  check_defined(input, op, "input");
  check_floating(input, op);
  WEFT_CHECK(input.dim() == 3 || input.dim() == 4, op,
             ": expected a 3-d [C, H, W] or 4-d [N, C, H, W] input, got shape ", input.shape());
  for (int64_t d = input.dim() - 3; d < input.dim(); ++d)
    WEFT_CHECK(input.size(d) > 0, op, ": expected non-zero C, H and W (only the batch may be empty), got shape ",
               input.shape());
}

// Checks the window arguments and resolves stride {} to kernel_size.
Pool2dGeometry make_geometry(const char* op, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  WEFT_CHECK(kernel[0] > 0 && kernel[1] > 0, op, ": kernel_size must be positive, got ", pair_str(kernel));
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  WEFT_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive (or {} for kernel_size), got ",
             pair_str(stride));
  WEFT_CHECK(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be non-negative, got ", pair_str(padding));
  WEFT_CHECK(dilation[0] > 0 && dilation[1] > 0, op, ": dilation must be positive, got ", pair_str(dilation));
  WEFT_CHECK(padding[0] <= kernel[0] / 2 && padding[1] <= kernel[1] / 2, op, ": padding ", pair_str(padding),
             " must be at most half of kernel_size ", pair_str(kernel));
  return {kernel, stride, padding, dilation};
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// PyTorch's pooling_output_shape: with ceil_mode, the last window must start inside the
// input or the left padding, never in the right padding.
int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t out = floor_div(in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0), s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

// Whether every window along a dim covers at least one input element. Windows that start
// inside the input do; with dilation, one that starts in the left padding can step over
// the whole input (size 2, kernel 2, padding 1, dilation 3 taps -1 and 2), and max
// pooling would then have no element to pick and no index to record.
bool windows_touch_input(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d) {
  for (int64_t o = 0; o < out && o * s - p < 0; ++o) {
    bool touches = false;
    for (int64_t t = 0; t < k && !touches; ++t) touches = o * s - p + t * d >= 0 && o * s - p + t * d < in;
    if (!touches) return false;
  }
  return true;
}

Shape pooled_shape(const char* op, const Tensor& x, const Pool2dGeometry& g, bool ceil_mode) {
  int64_t oh = pooled_size(x.size(2), g.kernel[0], g.stride[0], g.padding[0], g.dilation[0], ceil_mode);
  int64_t ow = pooled_size(x.size(3), g.kernel[1], g.stride[1], g.padding[1], g.dilation[1], ceil_mode);
  WEFT_CHECK(oh > 0 && ow > 0, op, ": input shape ", x.shape(), " is too small for kernel_size ", pair_str(g.kernel),
             ", dilation ", pair_str(g.dilation), " and padding ", pair_str(g.padding), " (output size would be ",
             oh, "x", ow, ")");
  WEFT_CHECK(windows_touch_input(x.size(2), oh, g.kernel[0], g.stride[0], g.padding[0], g.dilation[0]) &&
                 windows_touch_input(x.size(3), ow, g.kernel[1], g.stride[1], g.padding[1], g.dilation[1]),
             op, ": with input shape ", x.shape(), ", kernel_size ", pair_str(g.kernel), ", dilation ",
             pair_str(g.dilation), " and padding ", pair_str(g.padding),
             " a pooling window would cover only padding; reduce the padding or the dilation");
  return {x.size(0), x.size(1), oh, ow};
}

// Runs a 4-d op on a 3-d input as a batch of one.
template <class F>
auto batched(const Tensor& input, F op4d) {
  if (input.dim() == 4) return op4d(input);
  auto result = op4d(input.unsqueeze(0));
  if constexpr (std::is_same_v<decltype(result), Tensor>) {
    return result.squeeze(0);
  } else {
    return std::pair<Tensor, Tensor>{result.first.squeeze(0), result.second.squeeze(0)};
  }
}

std::pair<Tensor, Tensor> max_pool2d_4d(const Tensor& x, const Pool2dGeometry& g, bool ceil_mode) {
  Shape shape = pooled_shape("max_pool2d", x, g, ceil_mode);
  Tensor out = empty(shape, TensorOptions(x.dtype(), x.device()));
  Tensor indices = empty(shape, TensorOptions(DType::Int64, x.device()));
  if (out.numel() > 0) max_pool2d_stub(x.device(), x, out, indices, g);
  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         "MaxPool2dBackward",
                         [si = SavedTensor(indices), in_shape = x.shape()](const GradList& grads) -> GradList {
                           const Tensor& go = grads[0];
                           Tensor gi = empty(in_shape, TensorOptions(go.dtype(), go.device()));
                           if (gi.numel() > 0) max_pool2d_backward_stub(go.device(), go.contiguous(), si.unpack(), gi);
                           return {gi};
                         },
                         x));
  }
  return {out, indices};
}

Tensor avg_pool2d_4d(const Tensor& x, const Pool2dGeometry& g, bool ceil_mode, bool count_include_pad) {
  Tensor out = empty(pooled_shape("avg_pool2d", x, g, ceil_mode), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) avg_pool2d_stub(x.device(), x, out, g, count_include_pad);
  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         "AvgPool2dBackward",
                         [g, count_include_pad, in_shape = x.shape()](const GradList& grads) -> GradList {
                           const Tensor& go = grads[0];
                           Tensor gi = empty(in_shape, TensorOptions(go.dtype(), go.device()));
                           if (gi.numel() > 0)
                             avg_pool2d_backward_stub(go.device(), go.contiguous(), gi, g, count_include_pad);
                           return {gi};
                         },
                         x));
  }
  return out;
}

Tensor adaptive_avg_pool2d_4d(const Tensor& x, Pair output_size) {
  Tensor out = empty({x.size(0), x.size(1), output_size[0], output_size[1]}, TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) adaptive_avg_pool2d_stub(x.device(), x, out);
  if (any_requires_grad(x)) {
    set_history(out, make_node(
                         "AdaptiveAvgPool2dBackward",
                         [in_shape = x.shape()](const GradList& grads) -> GradList {
                           const Tensor& go = grads[0];
                           Tensor gi = empty(in_shape, TensorOptions(go.dtype(), go.device()));
                           if (gi.numel() > 0) adaptive_avg_pool2d_backward_stub(go.device(), go.contiguous(), gi);
                           return {gi};
                         },
                         x));
  }
  return out;
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, Pair kernel_size, Pair stride, Pair padding,
                                                  Pair dilation, bool ceil_mode) {
  check_pool_input(input, "max_pool2d");
  Pool2dGeometry g = make_geometry("max_pool2d", kernel_size, stride, padding, dilation);
  return batched(input, [&](const Tensor& x) { return max_pool2d_4d(x, g, ceil_mode); });
}

Tensor max_pool2d(const Tensor& input, Pair kernel_size, Pair stride, Pair padding, Pair dilation, bool ceil_mode) {
  return max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode).first;
}

Tensor avg_pool2d(const Tensor& input, Pair kernel_size, Pair stride, Pair padding, bool ceil_mode,
                  bool count_include_pad) {
  check_pool_input(input, "avg_pool2d");
  Pool2dGeometry g = make_geometry("avg_pool2d", kernel_size, stride, padding, {1, 1});
  return batched(input, [&](const Tensor& x) { return avg_pool2d_4d(x, g, ceil_mode, count_include_pad); });
}

Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size) {
  check_pool_input(input, "adaptive_avg_pool2d");
  WEFT_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got ",
             pair_str(output_size));
  return batched(input, [&](const Tensor& x) { return adaptive_avg_pool2d_4d(x, output_size); });
}

}  // namespace weft
