// allreduce: all-reduce speed in the format of NVIDIA's nccl-tests: on CPU ranks weft's Gloo
// backend and weft's own ring (parallel/process_group/ring_allreduce.h) side by side; on GPUs
// (--device cuda) weft's NCCL backend, the ring over NCCL's sends and receives, and
// ncclAllReduce called directly (bench/nccl_direct.h), in the same run.
//
//   build/bench/allreduce [--device cpu|cuda] [--ranks 2,4] [--min-bytes 8] [--max-bytes 256M]
//                         [--iters N] [--type float32|float64|float16|bfloat16] [--json FILE]
//
// Started by hand it starts its own ranks (this executable again, once per rank, with the
// variables weft-run sets, and NCCL over loopback sockets when ranks outnumber GPUs) for
// each world size in --ranks; started under weft-run, torchrun or mpirun it is one rank of
// that job. Rank 0 prints, for each size: the element count, type and reduce op, then per
// algorithm the time of one all-reduce (the mean over --iters calls after a warm-up, the
// slowest rank's; on GPUs the calls are queued back to back and the device synchronised
// at the end, as nccl-tests does), algbw = bytes / time and busbw = algbw * 2 (n - 1) / n,
// and #wrong, the elements that differ from the exact sum (every rank contributes rank + 1
// in every element, so the sum is an exact small integer).
//
// How to read busbw: a ring all-reduce moves 2 (n - 1) / n of the buffer through every
// rank's link, whatever n is, so busbw is the bandwidth each link sustained, comparable
// across world sizes and with the hardware's figure (on CPU ranks: TCP over loopback,
// which is a memory copy through the kernel; on GPUs: NVLink or PCIe).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <weft.h>

#include "bench_util.h"
#include "local_ranks.h"
#include "nccl_direct.h"
#include "parallel/launch/launch_env.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/process_group_gloo.h"
#include "parallel/process_group/process_group_nccl.h"
#include "parallel/process_group/ring_allreduce.h"

using namespace weft;
using namespace weft::parallel;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  bool cuda = false;
  std::string ranks = "2,4";
  int64_t min_bytes = 8, max_bytes = int64_t{256} << 20;
  int iters = 0;  // 0: by size (more for small buffers)
  DType dtype = DType::Float32;
  std::string json;
};

int64_t parse_bytes(const std::string& text) {
  char unit = text.empty() ? '\0' : text.back();
  int64_t scale = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1;
  return std::stoll(scale == 1 ? text : text.substr(0, text.size() - 1)) * scale;
}

int iterations(const Config& c, int64_t bytes) {
  if (c.iters > 0) return c.iters;
  return bytes <= (1 << 16) ? 50 : bytes <= (1 << 22) ? 20 : bytes <= (1 << 26) ? 5 : 2;
}

struct Result {
  double us = 0;
  int64_t wrong = 0;
};

// The slowest rank's time and every rank's wrong elements.
Result slowest(ProcessGroup& group, Result mine, Device device) {
  Tensor stats = tensor(std::vector<double>{mine.us, static_cast<double>(mine.wrong)}).to(device);
  group.all_reduce(stats, ReduceOp::Max)->wait();
  auto v = stats.to_vector<double>();
  return {v[0], static_cast<int64_t>(v[1])};
}

// One algorithm at one size: warm-up, timed loop, check; the slowest rank's time.
Result measure(ProcessGroup& group, ProcessGroup& reducer, int64_t count, DType dtype, int iters, Device device) {
  const int n = group.size();
  const double mine = group.rank() + 1;
  Tensor t = full({count}, mine, TensorOptions(dtype, device));
  reducer.all_reduce(t)->wait();  // warm-up (and the connections' first use)
  group.barrier()->wait();
  double us = 0;
  if (device.is_cuda()) {
    // Queued back to back (the values grow; the check below starts again from rank + 1).
    synchronize(device);
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) reducer.all_reduce(t)->wait();
    synchronize(device);
    us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
  } else {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      fill_(t, mine);
      reducer.all_reduce(t)->wait();
    }
    us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
    // The fill_ is inside the loop: time it alone and take it out.
    auto fill_start = Clock::now();
    for (int i = 0; i < iters; ++i) fill_(t, mine);
    us = std::max(0.0, us - std::chrono::duration<double, std::micro>(Clock::now() - fill_start).count() / iters);
  }
  fill_(t, mine);
  reducer.all_reduce(t)->wait();
  return slowest(group, {us, sum(ne(t.to(DType::Float64), n * (n + 1) / 2.0).to(DType::Int64)).item<int64_t>()},
                 device);
}

DType parse_type(const std::string& name) {
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    if (dtype_name(d) == name) return d;
  throw std::invalid_argument(name);
}

int run_rank(const Config& c) {
  InitOptions options;
  options.timeout = std::chrono::minutes(5);
  init_process_group(c.cuda ? "nccl" : "gloo", options);
  ProcessGroup& group = default_group();
  const int n = group.size();
  const Device device = c.cuda ? Device::cuda(read_launch_env().local_rank % cuda_device_count()) : kCPU;
  auto ring = with_ring_all_reduce(std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
  std::unique_ptr<bench::DirectNccl> direct;
  if (c.cuda)
    direct = std::make_unique<bench::DirectNccl>(*default_store(), group.rank(), n,
                                                 read_launch_env().local_rank % cuda_physical_device_count(),
                                                 c.max_bytes);
  const bool print = group.rank() == 0;
  const int64_t element = element_size(c.dtype);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  const std::vector<std::string> names = c.cuda ? std::vector<std::string>{"nccl", "ring", "direct"}
                                                : std::vector<std::string>{"gloo", "ring"};
  bench::JsonWriter json;
  int64_t total_wrong = 0;
  if (print) {
    std::cout << "#\n# allreduce: " << n << " ranks on this machine, ";
    if (c.cuda)
      std::cout << cuda_physical_device_count() << " GPU(s); NCCL " << collective_library(DeviceType::CUDA).version()
                << "\n#                                        nccl (weft's NCCL backend)        "
                   "ring (over NCCL send/recv)        direct (ncclAllReduce)\n";
    else
      std::cout << "Gloo over TCP (loopback); " << num_threads() << " CPU thread(s) per rank\n"
                << "#                                        gloo (weft's Gloo backend)        "
                   "ring (parallel/process_group/ring_allreduce)\n";
    std::cout << "#       size      count    type  redop";
    for (size_t k = 0; k < names.size(); ++k) std::cout << "      time   algbw   busbw  #wrong";
    std::cout << "\n#        (B)" << std::string(26, ' ');
    for (size_t k = 0; k < names.size(); ++k) std::cout << "      (us)  (GB/s)  (GB/s)        ";
    std::cout << "\n";
  }
  for (int64_t bytes = c.min_bytes; bytes <= c.max_bytes; bytes *= 2) {
    const int64_t count = std::max<int64_t>(1, bytes / element);
    const int iters = iterations(c, bytes);
    std::vector<Result> results{measure(group, group, count, c.dtype, iters, device),
                                measure(group, *ring, count, c.dtype, iters, device)};
    if (direct) {
      bench::DirectResult d = direct->all_reduce(count, c.dtype, iters);
      results.push_back(slowest(group, {d.us, d.wrong}, device));
    }
    for (const Result& r : results) total_wrong += r.wrong;
    if (!print) continue;
    std::cout << std::setw(12) << count * element << std::setw(11) << count << std::setw(8) << dtype_name(c.dtype)
              << std::setw(7) << "sum";
    const std::string key = std::to_string(n) + "ranks_" + std::to_string(count * element) + "B_";
    for (size_t k = 0; k < results.size(); ++k) {
      const Result& x = results[k];
      const double algbw = static_cast<double>(count * element) / (x.us * 1e3);
      std::cout << std::setw(10) << std::fixed << std::setprecision(1) << x.us << std::setw(8) << std::setprecision(2)
                << algbw << std::setw(8) << algbw * bus_factor << std::setw(8) << x.wrong;
      json.add(key + names[k] + "_us", x.us);
      json.add(key + names[k] + "_busbw_GBps", algbw * bus_factor);
    }
    std::cout << "\n";
  }
  if (print) {
    std::cout << "# #wrong in all: " << total_wrong << "\n";
    if (!c.json.empty()) json.write(c.json + "." + std::to_string(n) + "ranks");
  }
  direct.reset();
  ring.reset();
  destroy_process_group();
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "allreduce: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--device") {
        const std::string d = next();
        if (d != "cpu" && d != "cuda") throw std::invalid_argument(d);
        c.cuda = d == "cuda";
      } else if (a == "--ranks") c.ranks = next();
      else if (a == "--min-bytes") c.min_bytes = parse_bytes(next());
      else if (a == "--max-bytes") c.max_bytes = parse_bytes(next());
      else if (a == "--iters") c.iters = std::stoi(next());
      else if (a == "--type") c.dtype = parse_type(next());
      else if (a == "--json") c.json = next();
      else if (a == "--help" || a == "-h") {
        std::cout << "usage: allreduce [--device cpu|cuda] [--ranks 2,4] [--min-bytes 8] [--max-bytes 256M] "
                     "[--iters N] [--type float32|float64|float16|bfloat16] [--json FILE]\n";
        return 0;
      } else {
        std::cerr << "allreduce: unknown argument " << a
                  << " (expected --device, --ranks, --min-bytes, --max-bytes, --iters, --type, --json)\n";
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << "allreduce: bad value for " << a << "\n";
      return 2;
    }
  }
  if (c.cuda && is_half_precision(c.dtype)) {
    std::cerr << "allreduce: --type " << c.dtype << " is for CPU ranks (on GPUs the direct NCCL comparison is float32 "
              << "or float64)\n";
    return 2;
  }
  if (bench::skipped_without_backend("allreduce", c.cuda)) return 0;
  try {
    if (launched_as_rank()) return run_rank(c);
    int failed = 0;
    std::stringstream list(c.ranks);
    std::string item;
    while (std::getline(list, item, ',')) failed |= bench::run_as_local_ranks(argv[0], argv, std::stoi(item), c.cuda);
    return failed;
  } catch (const std::exception& e) {
    std::cerr << "allreduce: " << e.what() << "\n";
    return 1;
  }
}
