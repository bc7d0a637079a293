// LibTorch side of bench/op_overhead: the same tiny add, from C++, same protocol
// (one thread, median of 31 rounds of 20000 calls), written as JSON in nanoseconds.
// Built only with -DWEFT_BENCH_LIBTORCH=ON (needs Debian's libtorch-dev).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <vector>

namespace {

template <class Body>
double median_ns_per_call(Body&& body, int rounds = 31, int calls = 20000) {
  for (int i = 0; i < calls; ++i) body();
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) body();
    per_call.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
                       calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "--json") != 0) return 2;
  at::set_num_threads(1);
  torch::Tensor a = torch::ones({1}), b = torch::ones({1}), out;
  torch::Tensor ga = torch::ones({1}, torch::requires_grad()), gb = torch::ones({1}, torch::requires_grad());
  double plain = median_ns_per_call([&] { out = torch::add(a, b); });
  double grad = median_ns_per_call([&] { out = torch::add(ga, gb); });
  std::ofstream(argv[2]) << "{\n  \"add_ns\": " << plain << ",\n  \"add_autograd_ns\": " << grad << "\n}\n";
  return 0;
}
