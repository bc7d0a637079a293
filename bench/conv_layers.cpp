// conv_layers: weft's CPU convolutions layer by layer, beside PyTorch's (mkldnn) on the same
// shapes: where a CPU training step of the ConvNet or the ResNet spends its convolution time.
//
// For each distinct convolution of the model (batch N, float32, random data), the median time
// of the forward and of forward + backward (grad_input and grad_weight, through autograd), on
// `--threads` threads (default 1: a rank of bench/ddp_overhead on a machine of one core per
// rank), with GFLOP/s (2 * N * O * C * kH * kW * OH * OW per forward, twice that per
// backward). bench/reference/conv_layers.py times torch.nn.functional.conv2d the same way in
// the same run. Each forward is checked in the same run against sums in double computed here
// from the inputs, at 64 output elements (#wrong counts those off by more than 1e-4 relative).
//
//   conv_layers [--model convnet|resnet|all] [--batch N] [--threads N] [--rounds N] [--json FILE]
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <weft.h>

#include "bench_util.h"

using namespace weft;

namespace {

struct Layer {
  const char* model;
  const char* name;
  int64_t in, out, size, kernel, stride, padding;  // square images and kernels
  int count;                                        // convolutions of this shape in the model
  bool bias;
};

// The ConvNet (nn/models/convnet.cpp) and the ResNet (nn/models/resnet.cpp) on 28x28 images.
const std::vector<Layer>& layers() {
  static const std::vector<Layer> all{
      {"convnet", "layer1", 1, 16, 28, 5, 1, 2, 1, true},
      {"convnet", "layer2", 16, 32, 14, 5, 1, 2, 1, true},
      {"resnet", "conv1", 1, 16, 28, 3, 1, 1, 1, false},
      {"resnet", "16->16", 16, 16, 28, 3, 1, 1, 4, false},
      {"resnet", "16->32 s2", 16, 32, 28, 3, 2, 1, 1, false},
      {"resnet", "16->32 1x1 s2", 16, 32, 28, 1, 2, 0, 1, false},
      {"resnet", "32->32", 32, 32, 14, 3, 1, 1, 3, false},
      {"resnet", "32->64 s2", 32, 64, 14, 3, 2, 1, 1, false},
      {"resnet", "32->64 1x1 s2", 32, 64, 14, 1, 2, 0, 1, false},
      {"resnet", "64->64", 64, 64, 7, 3, 1, 1, 3, false},
  };
  return all;
}

int64_t out_size(const Layer& l) { return (l.size + 2 * l.padding - l.kernel) / l.stride + 1; }

double forward_flops(const Layer& l, int64_t batch) {
  const double o = static_cast<double>(out_size(l));
  return 2.0 * static_cast<double>(batch * l.out * l.in * l.kernel * l.kernel) * o * o;
}

// The key the reference writes for a layer: "resnet_32->64 s2_forward_ms" etc.
std::string key(const Layer& l, const char* what) { return std::string(l.model) + "_" + l.name + "_" + what; }

// Output elements off by more than 1e-4 relative to a double sum over their taps.
int wrong_outputs(const Layer& l, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const std::vector<float> xs = x.to_vector<float>(), ws = w.to_vector<float>(), ys = y.to_vector<float>();
  const std::vector<float> bs = b.defined() ? b.to_vector<float>() : std::vector<float>();
  const int64_t os = out_size(l);
  Generator gen(99);
  const std::vector<int64_t> picks = randint(0, y.numel(), {64}, DType::Int64, &gen).to_vector<int64_t>();
  int wrong = 0;
  for (int64_t flat : picks) {
    const int64_t ow = flat % os, oh = flat / os % os, o = flat / (os * os) % l.out, s = flat / (os * os * l.out);
    double sum = bs.empty() ? 0.0 : bs[o], scale = std::abs(sum);
    for (int64_t c = 0; c < l.in; ++c)
      for (int64_t ki = 0; ki < l.kernel; ++ki)
        for (int64_t kj = 0; kj < l.kernel; ++kj) {
          const int64_t ih = oh * l.stride - l.padding + ki, iw = ow * l.stride - l.padding + kj;
          if (ih < 0 || iw < 0 || ih >= l.size || iw >= l.size) continue;
          const double term = double{ws[((o * l.in + c) * l.kernel + ki) * l.kernel + kj]} *
                              xs[((s * l.in + c) * l.size + ih) * l.size + iw];
          sum += term, scale += std::abs(term);
        }
    if (!(std::abs(ys[flat] - sum) <= 1e-4 * (scale + 1e-30))) ++wrong;
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "all", json_path;
  int64_t batch = 64;
  int threads = 1, rounds = 11;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "conv_layers: " << argv[i] << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    const std::string a = argv[i];
    if (a == "--model") model = next();
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--rounds") rounds = std::stoi(next());
    else if (a == "--json") json_path = next();
    else {
      const bool help = a == "--help" || a == "-h";
      (help ? std::cout : std::cerr)
          << "usage: conv_layers [--model convnet|resnet|all] [--batch N] [--threads N] [--rounds N] [--json FILE]\n";
      return help ? 0 : 2;
    }
  }
  if ((model != "convnet" && model != "resnet" && model != "all") || batch < 1 || threads < 1 || rounds < 1) {
    std::cerr << "conv_layers: --model is convnet, resnet or all; --batch, --threads and --rounds are positive\n";
    return 2;
  }
  set_num_threads(threads);
  const auto torch = bench::run_reference("conv_layers.py", "--model " + model + " --batch " + std::to_string(batch) +
                                                                " --threads " + std::to_string(threads) +
                                                                " --rounds " + std::to_string(rounds));
  std::cout << "# conv_layers: float32, batch " << batch << ", " << threads << " thread(s), median of " << rounds
            << " rounds; backward = forward + grad_input + grad_weight through autograd, less the forward\n"
            << "# model   layer            count   weft fwd  torch fwd   weft bwd  torch bwd   weft     weft/torch"
               "  #wrong\n"
            << "#                                     (ms)       (ms)       (ms)       (ms)  (GFLOP/s)   (fwd+bwd)\n";
  bench::JsonWriter json;
  double weft_total = 0, torch_total = 0;
  for (const Layer& l : layers()) {
    if (model != "all" && model != l.model) continue;
    Generator gen(7);
    Tensor x = randn({batch, l.in, l.size, l.size}, DType::Float32, &gen);
    Tensor w = mul(randn({l.out, l.in, l.kernel, l.kernel}, DType::Float32, &gen), 0.1);
    Tensor b = l.bias ? randn({l.out}, DType::Float32, &gen) : Tensor();
    const std::array<int64_t, 2> stride{l.stride, l.stride}, padding{l.padding, l.padding};
    Tensor y;
    const double forward_ns = bench::median_ns_per_call(rounds, 1, [&] {
      NoGradGuard no_grad;
      y = conv2d(x, w, b, stride, padding);
    });
    const int wrong = wrong_outputs(l, x, w, b, y);
    Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_();
    Tensor bg = b.defined() ? b.detach().requires_grad_() : Tensor();
    Tensor grad = randn(y.shape(), DType::Float32, &gen);
    const double both_ns = bench::median_ns_per_call(rounds, 1, [&] {
      xg.set_grad(Tensor()), wg.set_grad(Tensor());
      if (bg.defined()) bg.set_grad(Tensor());
      conv2d(xg, wg, bg, stride, padding).backward(grad);
    });
    const double fwd = forward_ns / 1e6, bwd = std::max(0.0, both_ns - forward_ns) / 1e6;
    const double flops = 3 * forward_flops(l, batch);
    const auto t_fwd = torch.find(key(l, "forward_ms")), t_bwd = torch.find(key(l, "backward_ms"));
    const bool have_torch = t_fwd != torch.end() && t_bwd != torch.end();
    weft_total += l.count * (fwd + bwd);
    if (have_torch) torch_total += l.count * (t_fwd->second + t_bwd->second);
    std::cout << std::left << std::setw(10) << l.model << std::setw(18) << l.name << std::right << std::setw(4)
              << l.count << std::fixed << std::setprecision(2) << std::setw(11) << fwd << std::setw(11)
              << (have_torch ? t_fwd->second : NAN) << std::setw(11) << bwd << std::setw(11)
              << (have_torch ? t_bwd->second : NAN) << std::setprecision(1) << std::setw(11) << flops / (both_ns)
              << std::setprecision(2) << std::setw(13)
              << (have_torch ? (fwd + bwd) / (t_fwd->second + t_bwd->second) : NAN) << std::setw(8) << wrong << "\n";
    json.add(key(l, "forward_ms"), fwd);
    json.add(key(l, "backward_ms"), bwd);
    json.add(key(l, "wrong"), wrong);
    if (have_torch) {
      json.add(key(l, "torch_forward_ms"), t_fwd->second);
      json.add(key(l, "torch_backward_ms"), t_bwd->second);
    }
  }
  std::cout << std::fixed << std::setprecision(2) << "# every convolution of a step, times its count: weft "
            << weft_total << " ms";
  if (torch.empty()) std::cout << "; PyTorch reference not run (no python3 with torch)\n";
  else std::cout << ", PyTorch " << torch_total << " ms (" << weft_total / torch_total << "x)\n";
  json.add("weft_step_conv_ms", weft_total);
  if (!torch.empty()) json.add("torch_step_conv_ms", torch_total);
  if (!json_path.empty() && !json.write(json_path)) {
    std::cerr << "conv_layers: cannot write " << json_path << "\n";
    return 1;
  }
  return 0;
}
