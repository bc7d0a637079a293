// dp_overhead: what DataParallel costs beyond the work itself.
//
//   build/bench/dp_overhead [--model convnet|resnet|all] [--batch N] [--steps N]
//                           [--device-type cpu|cuda] [--json FILE]
//
// One training step (forward, cross-entropy, backward, SGD step) of the same model at one
// total batch, on 1 device and with DataParallel over 2 and 4 logical devices (cpu:i, or
// cuda:i: virtual GPUs with WEFT_VIRTUAL_DEVICES). The work is the same at every width,
// so the ratio of a step to the 1-device step is the overhead: scattering the batch,
// replicating the parameters, running replicas on threads, gathering the outputs and
// summing the replicas' gradients. The table gives the median step and its breakdown:
// scatter, replicate, forward (parallel_apply), gather, loss + backward, optimizer step.
// The breakdown is timed in its own steps with the devices synchronised after each phase
// (on a GPU that serialises the phases; the step column is timed without). The check: after
// the timed steps, one DataParallel step's gradients are compared with one device's on the
// same batch and weights, in evaluation mode (the largest normalised error, float32; at most
// 1e-2). Target on the CPU: 2 devices cost at most 1.15x one device's step. PyTorch's
// DataParallel needs GPUs, so
// bench/reference/dp_overhead.py runs it only where CUDA is there (and PyTorch's 1-device
// step otherwise, for scale).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <weft.h>

#include "bench_util.h"
#include "parallel/local/comm.h"
#include "parallel/local/data_parallel.h"
#include "parallel/local/functions.h"
#include "parallel/local/parallel_apply.h"
#include "parallel/local/replicate.h"

using namespace weft;
using Clock = std::chrono::steady_clock;

namespace {

struct Phases {
  double scatter = 0, replicate = 0, forward = 0, gather = 0, backward = 0, step = 0;
};

double ms_since(Clock::time_point& t, const std::vector<Device>& devices, bool sync) {
  if (sync)
    for (Device d : devices) synchronize(d);
  auto now = Clock::now();
  double ms = std::chrono::duration<double, std::milli>(now - t).count();
  t = now;
  return ms;
}

std::shared_ptr<nn::Module> make_model(const std::string& name) {
  Generator gen(7);
  if (name == "convnet") return std::make_shared<nn::ConvNet>(10, &gen);
  return std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
}

// One step, phase by phase, as DataParallel runs it (n == 1: the module alone).
Phases step(nn::Module& model, optim::Optimizer& sgd, const Tensor& x, const Tensor& y,
            const std::vector<Device>& devices, bool sync) {
  Phases p;
  auto t = Clock::now();
  sgd.zero_grad();
  Tensor out;
  if (devices.size() == 1) {
    out = model.forward(x);
    p.forward = ms_since(t, devices, sync);
  } else {
    auto chunks = parallel::scatter(x, devices);
    p.scatter = ms_since(t, devices, sync);
    auto replicas = parallel::replicate(model, devices);
    p.replicate = ms_since(t, devices, sync);
    auto outputs = parallel::parallel_apply(replicas, chunks, devices);
    p.forward = ms_since(t, devices, sync);
    out = parallel::gather(outputs, devices[0]);
    p.gather = ms_since(t, devices, sync);
  }
  cross_entropy(out, y).backward();
  p.backward = ms_since(t, devices, sync);
  sgd.step();
  p.step = ms_since(t, devices, true);
  return p;
}

// Largest |a - b| / max|b| over every parameter's gradient (its normalised error). A wrong
// gradient is off by its own scale; summing in another order is not, but cuDNN's float32
// Winograd algorithms, which the replicas' smaller batches may get, are off by 1e-4 of it per
// layer (tests/cuda/test_cuda_nn_ops.cpp), and the ConvNet's gradients on 2 and 4 virtual GPUs of
// an H200 were off by 3.3e-3 and 1.5e-3 of theirs: hence 1e-2.
double gradient_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    auto va = a[i].to(kCPU).to_vector<double>(), vb = b[i].to(kCPU).to_vector<double>();
    double scale = 0;
    for (double v : vb) scale = std::max(scale, std::fabs(v));
    for (size_t k = 0; k < va.size(); ++k)
      worst = std::max(worst, std::fabs(va[k] - vb[k]) / (scale + 1e-30));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "all", type = "cpu", json_path;
  int64_t batch = 128;
  int steps = 15;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "dp_overhead: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") models = next();
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--device-type") type = next();
    else if (a == "--json") json_path = next();
    else if (a == "--help" || a == "-h") {
      std::cout << "usage: dp_overhead [--model convnet|resnet|all] [--batch N] [--steps N] [--device-type cpu|cuda] "
                   "[--json FILE]\n";
      return 0;
    } else {
      std::cerr << "dp_overhead: unknown argument " << a
                << " (expected --model, --batch, --steps, --device-type, --json)\n";
      return 2;
    }
  }
  if (type == "cuda" && !cuda_available()) {
    std::cerr << "dp_overhead: --device-type cuda, but " << cuda_unavailable_reason() << "\n";
    return 2;
  }
  const DeviceType device_type = type == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  const bool sync = device_type == DeviceType::CUDA;
  std::vector<std::string> names = models == "all" ? std::vector<std::string>{"convnet", "resnet"}
                                                   : std::vector<std::string>{models};
  bench::JsonWriter json;
  bool all_ok = true;
  std::cout << "# dp_overhead: one SGD step at batch " << batch << " on 1 device and DataParallel over 2 and 4 "
            << type << " devices; " << num_threads() << " CPU threads; median of " << steps << " steps, the widths timed in turns\n"
            << "# model    devices   step    ratio  scatter replicate forward  gather  backward optimizer  check\n"
            << "#                     (ms)           (ms)    (ms)     (ms)     (ms)    (ms)     (ms)     (normalised)\n";
  for (const std::string& name : names) {
    // One set-up per width, timed in turns (a step of each width, then the next round), so
    // that a slow spell of a shared machine lands on every width alike.
    struct Setup {
      int width;
      std::vector<Device> devices;
      std::shared_ptr<nn::Module> model;
      std::unique_ptr<optim::SGD> sgd;
      Tensor x, y;
      std::vector<double> totals;
      std::vector<Phases> phases;
    };
    std::vector<Setup> setups;
    for (int width : {1, 2, 4}) {
      if (device_type == DeviceType::CUDA && width > cuda_device_count()) {
        std::cout << name << " x" << width << ": skipped (" << cuda_device_count()
                  << " logical CUDA devices; set WEFT_VIRTUAL_DEVICES=4)\n";
        continue;
      }
      Setup s{width, {}, make_model(name), nullptr, {}, {}, {}, {}};
      for (int i = 0; i < width; ++i) s.devices.emplace_back(device_type, i);
      s.model->to(s.devices[0]);
      s.sgd = std::make_unique<optim::SGD>(s.model->parameters(), optim::SGDOptions{0.01, 0.9});
      Generator data(11);
      s.x = randn({batch, 1, 28, 28}, TensorOptions(DType::Float32, s.devices[0]), &data);
      s.y = randint(0, 10, {batch}, TensorOptions(DType::Int64, s.devices[0]), &data);
      for (int w = 0; w < 3; ++w) step(*s.model, *s.sgd, s.x, s.y, s.devices, sync);  // warm-up
      setups.push_back(std::move(s));
    }
    for (int round = 0; round < steps; ++round)
      for (Setup& s : setups) {
        auto t = Clock::now();
        step(*s.model, *s.sgd, s.x, s.y, s.devices, false);
        s.totals.push_back(ms_since(t, s.devices, true));
      }
    for (int round = 0; round < steps; ++round)
      for (Setup& s : setups) s.phases.push_back(step(*s.model, *s.sgd, s.x, s.y, s.devices, true));
    const double one_device = bench::median(setups.front().totals);
    for (Setup& s : setups) {
      auto med = [&](double Phases::*field) {
        std::vector<double> v;
        for (const Phases& p : s.phases) v.push_back(p.*field);
        return bench::median(v);
      };
      // The check: this width's gradients against one device's, same weights and batch, in
      // evaluation mode (BatchNorm in training mode normalises each chunk by its own
      // statistics, so the two differ there by design: DataParallel's BatchNorm caveat).
      double diff = 0;
      if (s.width > 1) {
        s.model->eval();
        auto reference = s.model->clone();
        s.sgd->zero_grad();
        cross_entropy(parallel::DataParallel(s.model, s.devices)(s.x), s.y).backward();
        cross_entropy(reference->forward(s.x), s.y).backward();
        std::vector<Tensor> got, want;
        for (const Tensor& p : s.model->parameters()) got.push_back(p.grad());
        for (const Tensor& p : reference->parameters()) want.push_back(p.grad());
        diff = gradient_difference(got, want);
      }
      const bool ok = diff < 1e-2;
      all_ok = all_ok && ok;
      const double total = bench::median(s.totals), ratio = total / one_device;
      std::cout << std::left << std::setw(9) << name << std::right << std::setw(4) << s.width << std::fixed
                << std::setprecision(2) << std::setw(10) << total << std::setw(8) << ratio << "x" << std::setw(8)
                << med(&Phases::scatter) << std::setw(9) << med(&Phases::replicate) << std::setw(9)
                << med(&Phases::forward) << std::setw(8) << med(&Phases::gather) << std::setw(9)
                << med(&Phases::backward) << std::setw(9) << med(&Phases::step) << "    " << std::scientific
                << std::setprecision(1) << diff << (ok ? " ok" : " WRONG") << std::defaultfloat << "\n";
      const std::string key = name + "_" + std::to_string(s.width) + "dev_";
      json.add(key + "step_ms", total);
      json.add(key + "ratio", ratio);
      json.add(key + "forward_ms", med(&Phases::forward));
      json.add(key + "backward_ms", med(&Phases::backward));
      json.add(key + "check_normalised_diff", diff);
    }
  }
  auto torch = bench::run_reference("dp_overhead.py", "--batch " + std::to_string(batch) + " --steps " +
                                                          std::to_string(steps) + " --threads " +
                                                          std::to_string(num_threads()));
  if (torch.empty()) {
    std::cout << "# PyTorch reference not run (no python3 with torch; tools/install-deps --bench)\n";
  } else {
    std::cout << "# PyTorch " << (torch.count("cuda") && torch["cuda"] > 0 ? "DataParallel on CUDA" : "1.13, CPU, one device")
              << ":";
    for (const auto& [key, value] : torch)
      if (key != "cuda") std::cout << " " << key << " " << std::fixed << std::setprecision(2) << value;
    std::cout << std::defaultfloat << "\n";
    for (const auto& [key, value] : torch) json.add("pytorch_" + key, value);
  }
  if (!json_path.empty() && !json.write(json_path)) {
    std::cerr << "dp_overhead: cannot write " << json_path << "\n";
    return 1;
  }
  return all_ok ? 0 : 1;
}
