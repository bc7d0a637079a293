// op_overhead: the framework's host cost per op.
//
// Times one tiny op (add of two one-element float32 tensors on the CPU, one thread), with
// and without autograd recording, as a median over many calls. The arithmetic is one
// float add, so what is measured is everything else: argument checks, output
// allocation, dispatch, and (with autograd) building the graph node. The same is
// measured for LibTorch from C++ (bench/reference/op_overhead_libtorch.cpp, built with
// -DWEFT_BENCH_LIBTORCH=ON) and PyTorch from Python (bench/reference/op_overhead.py),
// when they are there.
//
//   op_overhead [--json FILE] [--no-reference]
#include <cstring>
#include <iostream>
#include <iomanip>
#include <sstream>

#include <weft.h>

#include "bench_util.h"

using namespace weft;

int main(int argc, char** argv) {
  std::string json_path;
  bool reference = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--no-reference")) reference = false;
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::cout << "usage: op_overhead [--json FILE] [--no-reference]\n";
      return 0;
    } else {
      std::cerr << "usage: op_overhead [--json FILE] [--no-reference]\n";
      return 2;
    }
  }
  set_num_threads(1);
  constexpr int kRounds = 31, kCalls = 20000;

  Tensor a = ones({1}), b = ones({1});
  Tensor out;
  double plain_ns = bench::median_ns_per_call(kRounds, kCalls, [&] { out = add(a, b); });
  bool plain_ok = out.item() == 2.0 && !out.requires_grad();

  Tensor ga = ones({1}).requires_grad_(), gb = ones({1}).requires_grad_();
  double grad_ns = bench::median_ns_per_call(kRounds, kCalls, [&] { out = add(ga, gb); });
  bool grad_ok = out.item() == 2.0 && out.grad_fn() != nullptr;

  std::map<std::string, double> python, libtorch;
  if (reference) {
    python = bench::run_reference("op_overhead.py");
    libtorch = bench::run_executable_reference(argv[0], "op_overhead_libtorch");
  }

  std::cout << "# op_overhead: add of two one-element float32 tensors, CPU, 1 thread, median of " << kRounds
            << " x " << kCalls << " calls\n";
  std::cout << "# case                     weft   libtorch(C++)  pytorch(Python)  libtorch/weft  check\n";
  std::cout << "#                       (us/op)         (us/op)          (us/op)\n";
  auto cell = [](const std::map<std::string, double>& m, const char* key, int width) {
    std::ostringstream out;
    if (m.count(key)) out << std::fixed << std::setprecision(3) << m.at(key) / 1000.0;
    else out << "n/a";
    std::string s = out.str();
    return std::string(width - std::min<int>(width, s.size()), ' ') + s;
  };
  auto row = [&](const char* name, double ns, const char* key, bool ok) {
    std::ostringstream ratio;
    if (libtorch.count(key)) ratio << std::fixed << std::setprecision(2) << libtorch[key] / ns;
    else ratio << "n/a";
    std::cout << std::left << std::setw(20) << name << std::right << std::fixed << std::setprecision(3)
              << std::setw(10) << ns / 1000.0 << cell(libtorch, key, 16) << cell(python, key, 17) << std::setw(15)
              << ratio.str() << std::setw(7) << (ok ? "ok" : "WRONG") << "\n";
  };
  row("add (no autograd)", plain_ns, "add_ns", plain_ok);
  row("add (autograd)", grad_ns, "add_autograd_ns", grad_ok);
  if (reference && python.empty())
    std::cout << "# PyTorch (Python) not run: no python3 can import torch (tools/install-deps --bench)\n";
  if (reference && libtorch.empty())
    std::cout << "# LibTorch (C++) not run: configure with -DWEFT_BENCH_LIBTORCH=ON (needs libtorch-dev)\n";

  if (!json_path.empty()) {
    bench::JsonWriter json;
    json.add("benchmark", std::string("op_overhead"));
    json.add("weft_add_ns", plain_ns);
    json.add("weft_add_autograd_ns", grad_ns);
    for (const char* key : {"add_ns", "add_autograd_ns"}) {
      if (python.count(key)) json.add(std::string("pytorch_python_") + key, python[key]);
      if (libtorch.count(key)) json.add(std::string("libtorch_") + key, libtorch[key]);
    }
    json.add("correct", std::string(plain_ok && grad_ok ? "yes" : "no"));
    if (!json.write(json_path)) {
      std::cerr << "op_overhead: cannot write " << json_path << "\n";
      return 1;
    }
  }
  return plain_ok && grad_ok ? 0 : 1;
}
