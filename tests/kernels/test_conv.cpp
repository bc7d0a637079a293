// conv2d: forward against a naive float64 loop over every configuration knob, gradcheck
// of input / weight / bias, float32 backward against float64, thread-count independence
// and error texts.
#include <vector>

#include "test_util.h"

using namespace weft;
using test::leaf;
using test::noncontiguous;
using test::random;

namespace {

struct Config {
  Shape input, weight;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
};

// The definition: out[n, o, y, x] = bias[o] + sum over (c in o's group, ki, kj) of
// weight[o, c, ki, kj] * input[n, g * C/G + c, y * sh - ph + ki * dh, x * sw - pw + kj * dw].
Tensor reference_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Config& c) {
  const bool unbatched = input.dim() == 3;
  const Shape is = unbatched ? Shape{1, input.size(0), input.size(1), input.size(2)} : input.shape();
  const int64_t n = is[0], channels = is[1], h = is[2], w = is[3];
  const int64_t o_count = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  const int64_t og = o_count / c.groups;
  const int64_t oh = (h + 2 * c.padding[0] - c.dilation[0] * (kh - 1) - 1) / c.stride[0] + 1;
  const int64_t ow = (w + 2 * c.padding[1] - c.dilation[1] * (kw - 1) - 1) / c.stride[1] + 1;
  const std::vector<double> vx = input.to_vector<double>(), vw = weight.to_vector<double>();
  const std::vector<double> vb = bias.defined() ? bias.to_vector<double>() : std::vector<double>(o_count, 0.0);
  std::vector<double> out(n * o_count * oh * ow);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t o = 0; o < o_count; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          double acc = vb[o];
          const int64_t group = o / og;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t iy = y * c.stride[0] - c.padding[0] + ki * c.dilation[0];
                const int64_t ix = x * c.stride[1] - c.padding[1] + kj * c.dilation[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                const int64_t channel = group * cg + ci;
                acc += vw[((o * cg + ci) * kh + ki) * kw + kj] * vx[((s * channels + channel) * h + iy) * w + ix];
              }
          out[((s * o_count + o) * oh + y) * ow + x] = acc;
        }
  Shape shape = unbatched ? Shape{o_count, oh, ow} : Shape{n, o_count, oh, ow};
  return tensor<double>(out, shape);
}

Tensor run(const Tensor& input, const Tensor& weight, const Tensor& bias, const Config& c) {
  return conv2d(input, weight, bias, c.stride, c.padding, c.dilation, c.groups);
}

const std::vector<Config> kConfigs = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}},                 // same padding
    {{2, 3, 9, 8}, {5, 3, 3, 2}, {2, 3}, {1, 2}, {2, 1}},         // stride, padding, dilation per dim
    {{1, 2, 5, 5}, {3, 2, 5, 5}},                                 // kernel covers the input: 1x1 out
    {{3, 2, 4, 4}, {2, 2, 3, 3}, {1, 1}, {2, 2}, {1, 1}, 1, false},  // padding larger than needed, no bias
    {{2, 4, 9, 7}, {6, 2, 3, 2}, {1, 2}, {1, 0}, {1, 1}, 2},      // groups = 2
    {{2, 3, 8, 7}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 3},      // depthwise
    {{2, 3, 6, 5}, {6, 1, 3, 3}, {2, 1}, {1, 1}, {1, 2}, 3},      // depthwise, multiplier 2
    {{3, 5, 4, 6}, {7, 5, 1, 1}},                                 // 1x1: input used as col directly
    {{2, 4, 5, 6}, {6, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2},      // grouped 1x1
    {{2, 5, 7, 6}, {3, 5, 1, 1}, {2, 2}},                         // 1x1 with stride
    {{2, 2, 5, 6}, {3, 2, 1, 1}, {1, 1}, {1, 1}},                 // 1x1 with padding
    {{4, 1, 28, 28}, {16, 1, 5, 5}, {1, 1}, {2, 2}},              // the ConvNet's first layer
    {{3, 16, 14, 14}, {32, 16, 5, 5}, {1, 1}, {2, 2}},            // ... and its second
    {{3, 4, 5}, {2, 3, 2, 3}, {1, 1}, {1, 0}},                    // unbatched [C, H, W]
    {{2, 1, 11, 3}, {2, 1, 4, 1}, {3, 1}, {0, 1}, {2, 1}},        // odd, thin
    // The direct kernel's edges: more output channels than two vectors hold (and not a
    // whole number of them), rows of 31 cut into blocks of unequal length, and the same
    // with groups, dilation and padding that differs per dimension.
    {{2, 3, 6, 31}, {37, 3, 3, 3}, {1, 1}, {1, 1}},
    {{1, 6, 5, 17}, {42, 2, 3, 5}, {1, 1}, {2, 1}, {2, 2}, 3},
    {{2, 5, 4, 23}, {19, 5, 2, 3}, {1, 2}, {1, 0}, {1, 3}},
    // ... and for the input gradient, whose output channels are the input's: 37 of them.
    {{2, 37, 5, 9}, {5, 37, 3, 3}, {1, 1}, {1, 1}},
    {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {3, 2}},  // padding beyond dilation * (k - 1): col2im
};

// The gradients of sum(out * upstream) by the definition: every term of the forward sum
// adds upstream * weight to grad_input and upstream * input to grad_weight.
std::pair<Tensor, Tensor> reference_input_weight_grads(const Tensor& input, const Tensor& weight,
                                                       const Tensor& upstream, const Config& c) {
  const int64_t n = input.size(0), channels = input.size(1), h = input.size(2), w = input.size(3);
  const int64_t o_count = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  const int64_t og = o_count / c.groups, oh = upstream.size(2), ow = upstream.size(3);
  const std::vector<double> vx = input.to_vector<double>(), vw = weight.to_vector<double>();
  const std::vector<double> vu = upstream.to_vector<double>();
  std::vector<double> gx(vx.size()), gw(vw.size());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t o = 0; o < o_count; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          const double u = vu[((s * o_count + o) * oh + y) * ow + x];
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t iy = y * c.stride[0] - c.padding[0] + ki * c.dilation[0];
                const int64_t ix = x * c.stride[1] - c.padding[1] + kj * c.dilation[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                const int64_t xi = ((s * channels + o / og * cg + ci) * h + iy) * w + ix;
                const int64_t wi = ((o * cg + ci) * kh + ki) * kw + kj;
                gx[xi] += u * vw[wi];
                gw[wi] += u * vx[xi];
              }
        }
  return {tensor<double>(gx, input.shape()), tensor<double>(gw, weight.shape())};
}

// Small versions for gradcheck (which builds full Jacobians).
const std::vector<Config> kGradConfigs = {
    {{2, 2, 4, 3}, {3, 2, 2, 2}, {1, 1}, {1, 1}},
    {{1, 2, 6, 5}, {2, 2, 3, 2}, {2, 2}, {1, 0}, {1, 2}},
    {{2, 4, 3, 4}, {4, 2, 2, 1}, {1, 1}, {0, 1}, {1, 1}, 2},
    {{1, 3, 4, 4}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 3},
    {{2, 3, 3, 2}, {2, 3, 1, 1}},
    {{2, 3, 4}, {2, 2, 2, 2}, {1, 2}, {1, 1}},
};

}  // namespace

TEST_CASE("conv2d: forward matches a naive loop") {
  uint64_t seed = 1;
  for (const Config& c : kConfigs) {
    CAPTURE(c.input);
    CAPTURE(c.weight);
    Tensor x = random(c.input, DType::Float64, seed++), w = random(c.weight, DType::Float64, seed++);
    Tensor b = c.bias ? random({c.weight[0]}, DType::Float64, seed++) : Tensor();
    CHECK_CLOSE(run(x, w, b, c), reference_conv2d(x, w, b, c), 1e-12, 1e-12);
    if (c.bias) CHECK_CLOSE(run(x, w, Tensor(), c), reference_conv2d(x, w, Tensor(), c), 1e-12, 1e-12);
  }
}

TEST_CASE("conv2d: float32 and non-contiguous operands") {
  uint64_t seed = 100;
  for (const Config& c : kConfigs) {
    CAPTURE(c.input);
    Tensor x = random(c.input, DType::Float32, seed++), w = random(c.weight, DType::Float32, seed++);
    Tensor b = random({c.weight[0]}, DType::Float32, seed++);
    Tensor out = run(x, w, b, c);
    CHECK(out.dtype() == DType::Float32);
    CHECK_CLOSE(out, reference_conv2d(x, w, b, c), 1e-4, 1e-4);
    CHECK_CLOSE(run(noncontiguous(x), noncontiguous(w), noncontiguous(b), c), out, 0, 0);
  }
}

TEST_CASE("conv2d: output shape follows PyTorch's formula") {
  Tensor w = random({4, 3, 3, 5});
  CHECK(conv2d(random({2, 3, 10, 11}), w).shape() == Shape{2, 4, 8, 7});
  CHECK(conv2d(random({2, 3, 10, 11}), w, Tensor(), {2, 3}, {1, 2}, {2, 1}).shape() == Shape{2, 4, 4, 4});
  CHECK(conv2d(random({3, 10, 11}), w).shape() == Shape{4, 8, 7});
  CHECK(conv2d(random({0, 3, 10, 11}), w).shape() == Shape{0, 4, 8, 7});
}

TEST_CASE("conv2d: gradcheck of input, weight and bias") {
  uint64_t seed = 200;
  for (const Config& c : kGradConfigs) {
    CAPTURE(c.input);
    CAPTURE(c.weight);
    Tensor x = leaf(c.input, seed++), w = leaf(c.weight, seed++), b = leaf({c.weight[0]}, seed++);
    auto fn = [c](const std::vector<Tensor>& in) { return run(in[0], in[1], in[2], c); };
    CHECK_GRADCHECK(fn, (std::vector<Tensor>{x, w, b}));
    // Each input alone: the node must compute exactly the gradients that are needed.
    Tensor fx = random(c.input, DType::Float64, seed++), fw = random(c.weight, DType::Float64, seed++);
    Tensor fb = random({c.weight[0]}, DType::Float64, seed++);
    CHECK_GRADCHECK(fn, (std::vector<Tensor>{x, fw, fb}));
    CHECK_GRADCHECK(fn, (std::vector<Tensor>{fx, w, fb}));
    CHECK_GRADCHECK(fn, (std::vector<Tensor>{fx, fw, b}));
    CHECK_GRADCHECK([c](const std::vector<Tensor>& in) { return run(in[0], in[1], Tensor(), c); },
                    (std::vector<Tensor>{x, w}));
  }
}

TEST_CASE("conv2d: gradcheck through non-contiguous views") {
  Tensor x = leaf({3, 2, 4, 2}, 1), w = leaf({2, 2, 3, 2}, 2), b = leaf({6}, 3);
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0].permute({3, 1, 2, 0}), in[1].transpose(0, 2), in[2].slice(0, 0, 6, 2), {1, 1}, {1, 1});
      },
      (std::vector<Tensor>{x, w, b}));
}

TEST_CASE("conv2d: float32 backward matches float64") {
  for (const Config& c : {kConfigs[1], kConfigs[4], kConfigs[7], kConfigs[12]}) {
    CAPTURE(c.input);
    Tensor x = random(c.input, DType::Float64, 300), w = random(c.weight, DType::Float64, 301);
    Tensor b = random({c.weight[0]}, DType::Float64, 302);
    Tensor upstream = random(reference_conv2d(x, w, b, c).shape(), DType::Float64, 303);
    std::vector<Tensor> grads[2];
    for (DType dtype : {DType::Float64, DType::Float32}) {
      Tensor xi = x.to(dtype).detach().requires_grad_(), wi = w.to(dtype).detach().requires_grad_();
      Tensor bi = b.to(dtype).detach().requires_grad_();
      run(xi, wi, bi, c).backward(upstream.to(dtype));
      grads[dtype == DType::Float32].assign({xi.grad(), wi.grad(), bi.grad()});
    }
    for (int i = 0; i < 3; ++i) CHECK_CLOSE(grads[1][i], grads[0][i], 1e-3, 1e-4);
  }
}

TEST_CASE("conv2d: input and weight gradients match the definition") {
  // grad_input by the direct kernel (unit stride, grad_out padded or not) and by col2im
  // (strided, or padding beyond dilation * (k - 1)); channel and row tails, groups,
  // dilation, and the ConvNet's second layer.
  uint64_t seed = 400;
  for (int i : {0, 1, 3, 4, 10, 12, 15, 16, 17, 18, 19}) {
    const Config& c = kConfigs[i];
    CAPTURE(c.input);
    CAPTURE(c.weight);
    Tensor x = random(c.input, DType::Float64, seed++), w = random(c.weight, DType::Float64, seed++);
    Tensor upstream = random(reference_conv2d(x, w, Tensor(), c).shape(), DType::Float64, seed++);
    const auto [ref_gx, ref_gw] = reference_input_weight_grads(x, w, upstream, c);
    for (DType dtype : {DType::Float64, DType::Float32}) {
      CAPTURE(dtype);
      const double tol = dtype == DType::Float64 ? 1e-12 : 1e-4;
      Tensor xi = x.to(dtype).detach().requires_grad_(), wi = w.to(dtype).detach().requires_grad_();
      run(xi, wi, Tensor(), c).backward(upstream.to(dtype));
      CHECK_CLOSE(xi.grad(), ref_gx, tol, tol);
      CHECK_CLOSE(wi.grad(), ref_gw, tol, tol);
    }
  }
}

TEST_CASE("conv2d: forward and backward do not depend on the thread count") {
  // 70 samples: more than the 64 grad_weight partials, so chunks have uneven sizes.
  Config c{{70, 3, 9, 8}, {8, 3, 3, 3}, {1, 1}, {1, 1}};
  Tensor x = random(c.input, DType::Float32, 1), w = random(c.weight, DType::Float32, 2);
  Tensor b = random({8}, DType::Float32, 3);
  Tensor upstream = random({70, 8, 9, 8}, DType::Float32, 4);
  const int threads = num_threads();
  std::vector<std::vector<float>> results[2];
  for (int t : {1, 2}) {
    set_num_threads(t);
    Tensor xi = x.clone().requires_grad_(), wi = w.clone().requires_grad_(), bi = b.clone().requires_grad_();
    Tensor out = run(xi, wi, bi, c);
    out.backward(upstream);
    for (const Tensor& r : {out, xi.grad(), wi.grad(), bi.grad()}) results[t - 1].push_back(r.to_vector<float>());
  }
  set_num_threads(threads);
  for (int i = 0; i < 4; ++i) CHECK(results[0][i] == results[1][i]);
}

TEST_CASE("conv2d: errors") {
  Tensor x = random({2, 3, 6, 6}), w = random({4, 3, 3, 3});
  CHECK_THROWS_WITH_AS(conv2d(x, random({4, 2, 3, 3})),
                       doctest::Contains("conv2d: input shape [2, 3, 6, 6] has 3 channels, but weight shape "
                                         "[4, 2, 3, 3] with groups 1 expects 2"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(x, random({4, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2),
                       doctest::Contains("expects 2 (weight.size(1) * groups)"), Error);
  CHECK_THROWS_WITH_AS(conv2d(random({2, 4, 6, 6}), random({3, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2),
                       doctest::Contains("conv2d: out_channels 3 (weight shape [3, 2, 3, 3]) is not divisible by groups 2"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(random({1, 3, 4, 4}), random({4, 3, 5, 5})),
                       doctest::Contains("conv2d: kernel size 5x5 (dilated extent 5 in dim 0) is larger than the "
                                         "padded input (4)"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(random({1, 3, 8, 4}), random({4, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 2}),
                       doctest::Contains("dilated extent 5 in dim 1) is larger than the padded input (4)"), Error);
  CHECK_NOTHROW(conv2d(random({1, 3, 4, 4}), random({4, 3, 5, 5}), Tensor(), {1, 1}, {1, 1}));
  CHECK_THROWS_WITH_AS(conv2d(random({3, 6, 6, 1, 1}), w),
                       doctest::Contains("conv2d: expected a 4-d input [N, C, H, W] or a 3-d unbatched input"), Error);
  CHECK_THROWS_WITH_AS(conv2d(random({6, 6}), w), doctest::Contains("got shape [6, 6]"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, random({4, 3, 3})), doctest::Contains("conv2d: expected a 4-d weight"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w, random({3})),
                       doctest::Contains("conv2d: expected bias of shape [4] for weight shape [4, 3, 3, 3], got [3]"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w, Tensor(), {0, 1}), doctest::Contains("conv2d: stride must be positive"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w, Tensor(), {1, 1}, {-1, 0}), doctest::Contains("padding must be non-negative"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {1, 0}), doctest::Contains("dilation must be positive"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {1, 1}, 0), doctest::Contains("groups must be positive"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(x.to(DType::Float32), w), doctest::Contains("conv2d: dtype mismatch"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w, random({4}, DType::Float32)), doctest::Contains("conv2d: dtype mismatch"), Error);
  CHECK_THROWS_WITH_AS(conv2d(arange(72).view({2, 1, 6, 6}), arange(9).view({1, 1, 3, 3})),
                       doctest::Contains("conv2d: expected a float32 or float64 tensor, got int64"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w.to(Device("cpu:1"))),
                       doctest::Contains("conv2d: expected all tensors on one device"), Error);
  CHECK_THROWS_WITH_AS(conv2d(Tensor(), w), doctest::Contains("conv2d: argument 'input' is an undefined tensor"),
                       Error);
}
