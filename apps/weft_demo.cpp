// weft-demo: trains a two-layer perceptron on Fashion-MNIST on the CPU, using only the
// foundation (tensors, autograd, CPU kernels): linear layers, ReLU, cross-entropy and
// hand-written SGD with momentum. It is the README's main job until weft-train (with
// nn/, optimizers and the data pipeline) replaces it.
//
//   weft-demo [--epochs N] [--batch-size N] [--lr X] [--data-dir DIR] [--seed N]
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <string>

#include <weft.h>

#include "data/idx.h"

using namespace weft;

namespace {

struct Options {
  int epochs = 2;
  int64_t batch_size = 100;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
};

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw Error(std::string("weft-demo: ") + argv[i] + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--epochs") o.epochs = std::stoi(value(i));
    else if (arg == "--batch-size") o.batch_size = std::stoll(value(i));
    else if (arg == "--lr") o.lr = std::stod(value(i));
    else if (arg == "--seed") o.seed = std::stoull(value(i));
    else if (arg == "--data-dir") o.data_dir = value(i);
    else throw Error("weft-demo: unknown option '" + arg +
                     "' (expected --epochs, --batch-size, --lr, --seed, --data-dir)");
  }
  if (o.epochs < 1 || o.batch_size < 1 || !(o.lr > 0)) throw Error("weft-demo: epochs, batch size and lr must be positive");
  return o;
}

// Images as float32 [N, 784], normalised with Fashion-MNIST's mean and std; labels int64.
std::pair<Tensor, Tensor> load(const std::string& dir, const std::string& split) {
  std::string images = dir + "/" + split + "-images-idx3-ubyte.gz", labels = dir + "/" + split + "-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(images) || !std::filesystem::exists(labels))
    throw Error("weft-demo: Fashion-MNIST not found in " + dir +
                " (install the Debian package dataset-fashion-mnist: tools/install-deps)");
  Tensor x = read_idx(images).to(DType::Float32);
  x = div(sub(div(x.flatten(1), 255.0), 0.2860), 0.3530);
  return {x, read_idx(labels).to(DType::Int64)};
}

// PyTorch's nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both.
Tensor uniform_param(const Shape& shape, int64_t fan_in, Generator& gen) {
  double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return sub(mul(rand(shape, DType::Float32, &gen), 2 * bound), bound).requires_grad_();
}

}  // namespace

int main(int argc, char** argv) try {
  Options opt = parse(argc, argv);
  auto [train_x, train_y] = load(opt.data_dir, "train");
  auto [test_x, test_y] = load(opt.data_dir, "t10k");
  std::cout << "weft-demo: MLP 784-256-10 on Fashion-MNIST (" << train_x.size(0) << " train, " << test_x.size(0)
            << " test images), CPU, " << num_threads() << " threads\n";

  Generator gen(opt.seed);
  std::vector<Tensor> params = {uniform_param({256, 784}, 784, gen), uniform_param({256}, 784, gen),
                                uniform_param({10, 256}, 256, gen), uniform_param({10}, 256, gen)};
  std::vector<Tensor> velocity;
  for (const Tensor& p : params) velocity.push_back(zeros_like(p));
  auto forward = [&](const Tensor& x) {
    return linear(relu(linear(x, params[0], params[1])), params[2], params[3]);
  };

  const int64_t n = train_x.size(0), steps = n / opt.batch_size;
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    auto start = std::chrono::steady_clock::now();
    Tensor order = randperm(n, DType::Int64, &gen);
    double loss_sum = 0;
    for (int64_t step = 0; step < steps; ++step) {
      Tensor idx = order.narrow(0, step * opt.batch_size, opt.batch_size);
      Tensor loss = cross_entropy(forward(index_select(train_x, 0, idx)), index_select(train_y, 0, idx));
      for (Tensor& p : params) p.set_grad(Tensor());
      loss.backward();
      NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {  // SGD with momentum, PyTorch's form
        mul_(velocity[i], opt.momentum);
        add_(velocity[i], params[i].grad());
        sub_(params[i], mul(velocity[i], opt.lr));
      }
      loss_sum += loss.item();
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    NoGradGuard no_grad;
    Tensor predicted = argmax(forward(test_x), 1);
    double accuracy = sum(eq(predicted, test_y).to(DType::Int64)).item() / static_cast<double>(test_x.size(0));
    std::cout << "epoch " << epoch << ": loss " << std::fixed << std::setprecision(4) << loss_sum / steps
              << ", test accuracy " << accuracy << ", " << std::setprecision(0)
              << steps * opt.batch_size / seconds << " images/s\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << e.what() << "\n";
  return 1;
}
