// pipeline: what the schedules cost, beside their theory.
//
//   build/bench/pipeline [--device-type cpu|cuda] [--stages 2,4] [--micro-batches 1,2,4,8,16]
//                        [--micro-batch-size N] [--width N] [--steps N]
//                        [--activation-checkpointing never|except_last|always] [--json FILE]
//
// A balanced model (eight blocks of Linear(width, width) + ReLU, float32; every stage the same
// work) split over p devices (cpu:i, or cuda:i: virtual GPUs with WEFT_VIRTUAL_DEVICES), trained
// with micro-batches of a fixed size, so that each forward and backward costs the same whatever
// m is. Per schedule (GPipe, 1F1B, interleaved with 2 stages per device where m is a multiple
// of p): the median step, the bubble measured in the trace of one more step (per device, the
// time not covered by its forward and backward spans, between the first span's start and the
// last one's end, over all devices), the theory ((p-1)/(m+p-1) for GPipe and 1F1B,
// (p-1)/(v m+p-1) interleaved), and stage 0's peak memory above what it held before the step
// (its activations and the messages it receives). The check: the step's loss equals the whole
// model's on one device, on the same batch and weights. Target: the measured bubble within 5
// percentage points of the theory where every stage has a core (or a GPU) of its own. With
// --activation-checkpointing, the same with recomputed micro-batches: the time and memory
// that recomputation trades (the forward that runs again counts as backward in the bubble).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <weft.h>

#include "balanced_model.h"
#include "bench_util.h"

using namespace weft;
using namespace weft::parallel::pipeline;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kBlocks = bench::kBalancedBlocks;

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

// Per device row of the trace, the share of [first compute span's start, last one's end]
// that no forward or backward span covers, averaged over the rows.
double measured_bubble(const std::string& trace_json) {
  static const std::regex compute(R"(\d+[FB]\d+)");
  auto doc = nlohmann::json::parse(trace_json);
  std::map<int, double> busy;
  double first = 1e300, last = -1e300;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X" || !std::regex_match(e["name"].get<std::string>(), compute)) continue;
    const double begin = e["ts"].get<double>(), dur = e["dur"].get<double>();
    busy[e["pid"].get<int>()] += dur;
    first = std::min(first, begin);
    last = std::max(last, begin + dur);
  }
  if (busy.empty() || last <= first) return 0;
  double idle = 0;
  for (const auto& [pid, b] : busy) idle += 1.0 - b / (last - first);
  return idle / static_cast<double>(busy.size());
}

Tensor loss_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

}  // namespace

int main(int argc, char** argv) {
  std::string type = "cpu", json_path, stages_text = "2,4", micro_text = "1,2,4,8,16", recompute = "never";
  int64_t micro_batch_size = 16, width = 512;
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "pipeline: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device-type") type = next();
    else if (a == "--stages") stages_text = next();
    else if (a == "--micro-batches") micro_text = next();
    else if (a == "--micro-batch-size") micro_batch_size = std::stoll(next());
    else if (a == "--width") width = std::stoll(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--activation-checkpointing") recompute = next();
    else if (a == "--json") json_path = next();
    else if (a == "--help" || a == "-h") {
      std::cout << "usage: pipeline [--device-type cpu|cuda] [--stages 2,4] [--micro-batches 1,2,4,8,16] "
                   "[--micro-batch-size N] [--width N] [--steps N] [--activation-checkpointing "
                   "never|except_last|always] [--json FILE]\n";
      return 0;
    } else {
      std::cerr << "pipeline: unknown argument " << a << " (expected --device-type, --stages, --micro-batches, "
                << "--micro-batch-size, --width, --steps, --activation-checkpointing, --json)\n";
      return 2;
    }
  }
  if (recompute != "never" && recompute != "except_last" && recompute != "always") {
    std::cerr << "pipeline: --activation-checkpointing must be never, except_last or always, got '" << recompute
              << "'\n";
    return 2;
  }
  if (type == "cuda" && !cuda_available()) {
    std::cerr << "pipeline: --device-type cuda, but " << cuda_unavailable_reason() << "\n";
    return 2;
  }
  const DeviceType device_type = type == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  bench::JsonWriter json;
  bool all_ok = true;
  std::cout << "# pipeline: " << kBlocks << " blocks of Linear(" << width << ", " << width
            << ") + ReLU, micro-batches of " << micro_batch_size << ", on " << type
            << " devices, activation checkpointing " << recompute << "; " << num_threads()
            << " CPU threads; median of " << steps << " steps\n"
            << "# stages  m  schedule      step (ms)  bubble  theory  stage-0 peak (KiB)  check (loss rel diff)\n";
  for (int p : parse_list(stages_text)) {
    if (device_type == DeviceType::CUDA && p > cuda_device_count()) {
      std::cout << "# " << p << " stages: skipped (" << cuda_device_count()
                << " logical CUDA devices; set WEFT_VIRTUAL_DEVICES)\n";
      continue;
    }
    std::vector<Device> devices;
    for (int i = 0; i < p; ++i) devices.emplace_back(device_type, i);
    for (int m : parse_list(micro_text)) {
      for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
        const int v = schedule == "interleaved" ? 2 : 1;
        if (schedule == "interleaved" && m % p != 0) continue;
        auto model = bench::balanced_model(width);
        auto reference = std::dynamic_pointer_cast<nn::Sequential>(model->clone());
        Pipeline pipe(model, {.devices = devices, .micro_batches = m, .schedule = schedule, .virtual_stages = v,
                              .activation_checkpointing = recompute});
        Generator data(11);
        const int64_t batch = micro_batch_size * m;
        Tensor x = randn({batch, width}, TensorOptions(DType::Float32, devices[0]), &data);
        Tensor y = randint(0, width, {batch}, TensorOptions(DType::Int64, devices[0]), &data);
        auto run_step = [&] {
          pipe.zero_grad();
          StepResult r = pipe.step(x, y, loss_of);
          for (Device d : devices) synchronize(d);
          return r;
        };
        const StepResult first = run_step();  // warm-up, and the check
        const double expected = loss_of(reference->forward(x.to(kCPU)), y.to(kCPU)).item();
        const double diff = std::fabs(first.loss.item() - expected) / std::max(1e-12, std::fabs(expected));
        const bool ok = diff < 1e-4;
        all_ok = all_ok && ok;
        std::vector<double> times;
        for (int s = 0; s < steps; ++s) {
          auto t = Clock::now();
          run_step();
          times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
        }
        const int64_t before = memory_stats(devices[0]).bytes_in_use;
        reset_peak_memory_stats(devices[0]);
        trace::start();
        run_step();
        trace::stop();
        const double peak_kib = static_cast<double>(memory_stats(devices[0]).peak_bytes_in_use - before) / 1024.0;
        const double bubble = measured_bubble(trace::json());
        const double theory = static_cast<double>(p - 1) / (v * m + p - 1);
        const double step_ms = bench::median(times);
        std::cout << std::setw(8) << p << std::setw(4) << m << "  " << std::left << std::setw(12) << schedule
                  << std::right << std::fixed << std::setprecision(2) << std::setw(11) << step_ms << std::setw(8)
                  << std::setprecision(3) << bubble << std::setw(8) << theory << std::setw(20) << std::setprecision(0)
                  << peak_kib << "  " << std::scientific << std::setprecision(1) << diff << (ok ? "" : " FAIL")
                  << std::defaultfloat << "\n";
        const std::string key = "p" + std::to_string(p) + "_m" + std::to_string(m) + "_" + schedule;
        json.add(key + "_step_ms", step_ms);
        json.add(key + "_bubble", bubble);
        json.add(key + "_theory", theory);
        json.add(key + "_stage0_peak_kib", peak_kib);
      }
    }
  }
  json.add("device_type", type);
  json.add("activation_checkpointing", recompute);
  json.add("threads", static_cast<double>(num_threads()));
  if (!json_path.empty() && !json.write(json_path)) {
    std::cerr << "pipeline: cannot write " << json_path << "\n";
    return 1;
  }
  if (!all_ok) std::cerr << "pipeline: a check failed (the pipeline's loss differs from one device's)\n";
  return all_ok ? 0 : 1;
}
