// allreduce: all-reduce speed in the format of NVIDIA's nccl-tests, for weft's Gloo backend
// and weft's own ring (parallel/ring_allreduce.h) side by side, on local ranks over loopback.
//
//   build/bench/allreduce [--ranks 2,4] [--min-bytes 8] [--max-bytes 256M] [--iters N]
//                         [--type float32|float64] [--json FILE]
//
// Started by hand it starts its own ranks (this executable again, once per rank, with the
// variables weft-run sets) for each world size in --ranks; started under weft-run, torchrun
// or mpirun it is one rank of that job. Rank 0 prints, for each size: the element count,
// type and reduce op, then per algorithm the time of one all-reduce (the mean over --iters
// calls after a warm-up, the slowest rank's), algbw = bytes / time and busbw = algbw *
// 2 (n - 1) / n, and #wrong, the elements that differ from the exact sum (every rank
// contributes rank + 1 in every element, so the sum is an exact small integer).
//
// How to read busbw: a ring all-reduce moves 2 (n - 1) / n of the buffer through every
// rank's link, whatever n is, so busbw is the bandwidth each link sustained, comparable
// across world sizes and with the hardware's figure (here: TCP over loopback, which is a
// memory copy through the kernel).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "parallel/distributed.h"
#include "parallel/process_group_gloo.h"
#include "parallel/ring_allreduce.h"

using namespace weft;
using namespace weft::parallel;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
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

// One algorithm at one size: warm-up, timed loop, check; the slowest rank's time.
Result measure(ProcessGroup& group, ProcessGroup& reducer, int64_t count, DType dtype, int iters) {
  const int n = group.size();
  Tensor t = full({count}, static_cast<double>(group.rank() + 1), TensorOptions(dtype, kCPU));
  reducer.all_reduce(t)->wait();  // warm-up (and the connections' first use)
  group.barrier()->wait();
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    fill_(t, static_cast<double>(group.rank() + 1));
    reducer.all_reduce(t)->wait();
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
  // The fill_ is inside the loop: time it alone and take it out.
  auto fill_start = Clock::now();
  for (int i = 0; i < iters; ++i) fill_(t, static_cast<double>(group.rank() + 1));
  const double fill_us = std::chrono::duration<double, std::micro>(Clock::now() - fill_start).count() / iters;
  reducer.all_reduce(t)->wait();
  const double expected = n * (n + 1) / 2.0;
  Tensor wrong = ne(t, expected).to(DType::Int64);
  Tensor stats = tensor(std::vector<double>{std::max(0.0, us - fill_us), static_cast<double>(sum(wrong).item())});
  group.all_reduce(stats, ReduceOp::Max)->wait();
  auto v = stats.to_vector<double>();
  return {v[0], static_cast<int64_t>(v[1])};
}

int run_rank(const Config& c) {
  InitOptions options;
  options.timeout = std::chrono::minutes(5);
  init_process_group("gloo", options);
  ProcessGroup& gloo = default_group();
  auto ring = with_ring_all_reduce(std::shared_ptr<ProcessGroup>(&gloo, [](ProcessGroup*) {}));
  const int n = gloo.size();
  const bool print = gloo.rank() == 0;
  const int64_t element = element_size(c.dtype);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  bench::JsonWriter json;
  int64_t total_wrong = 0;
  if (print) {
    std::cout << "#\n# allreduce: " << n << " ranks on this machine, Gloo over TCP (loopback); " << num_threads()
              << " CPU thread(s) per rank\n"
              << "#                                        gloo (weft's Gloo backend)         ring (parallel/ring_allreduce)\n"
              << "#       size      count    type  redop     time   algbw   busbw  #wrong      time   algbw   busbw  #wrong\n"
              << "#        (B)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n";
  }
  for (int64_t bytes = c.min_bytes; bytes <= c.max_bytes; bytes *= 2) {
    const int64_t count = std::max<int64_t>(1, bytes / element);
    const int iters = iterations(c, bytes);
    Result g = measure(gloo, gloo, count, c.dtype, iters);
    Result r = measure(gloo, *ring, count, c.dtype, iters);
    total_wrong += g.wrong + r.wrong;
    if (print) {
      auto columns = [&](const Result& x) {
        const double algbw = static_cast<double>(count * element) / (x.us * 1e3);
        std::cout << std::setw(10) << std::fixed << std::setprecision(1) << x.us << std::setw(8) << std::setprecision(2)
                  << algbw << std::setw(8) << algbw * bus_factor << std::setw(8) << x.wrong;
        return algbw * bus_factor;
      };
      std::cout << std::setw(12) << count * element << std::setw(11) << count << std::setw(8)
                << dtype_name(c.dtype) << std::setw(7) << "sum";
      const double g_bus = columns(g);
      std::cout << "  ";
      const double r_bus = columns(r);
      std::cout << "\n";
      const std::string key = std::to_string(n) + "ranks_" + std::to_string(count * element) + "B_";
      json.add(key + "gloo_us", g.us);
      json.add(key + "gloo_busbw_GBps", g_bus);
      json.add(key + "ring_us", r.us);
      json.add(key + "ring_busbw_GBps", r_bus);
    }
  }
  if (print) {
    std::cout << "# #wrong in all: " << total_wrong << "\n";
    if (!c.json.empty()) json.write(c.json + "." + std::to_string(n) + "ranks");
  }
  destroy_process_group();
  return total_wrong == 0 ? 0 : 1;
}

// A port on 127.0.0.1 that was free a moment ago.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("no free port on 127.0.0.1");
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Starts world ranks of this executable (with weft-run's variables) and waits for them.
int launch(const char* self, char** argv, int world) {
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      if (!std::getenv("OMP_NUM_THREADS"))
        ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1, num_threads() / world)).c_str(), 1);
      ::execv(self, argv);
      std::perror("allreduce: exec");
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
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
      if (a == "--ranks") c.ranks = next();
      else if (a == "--min-bytes") c.min_bytes = parse_bytes(next());
      else if (a == "--max-bytes") c.max_bytes = parse_bytes(next());
      else if (a == "--iters") c.iters = std::stoi(next());
      else if (a == "--type") c.dtype = next() == "float64" ? DType::Float64 : DType::Float32;
      else if (a == "--json") c.json = next();
      else {
        std::cerr << "allreduce: unknown argument " << a
                  << " (expected --ranks, --min-bytes, --max-bytes, --iters, --type, --json)\n";
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << "allreduce: bad value for " << a << "\n";
      return 2;
    }
  }
  if (!gloo_available()) {
    std::cout << "# allreduce: skipped: weft was built without Gloo\n";
    return 0;
  }
  try {
    if (launched_as_rank()) return run_rank(c);
    int failed = 0;
    std::stringstream list(c.ranks);
    std::string item;
    while (std::getline(list, item, ',')) failed |= launch(argv[0], argv, std::stoi(item));
    return failed;
  } catch (const std::exception& e) {
    std::cerr << "allreduce: " << e.what() << "\n";
    return 1;
  }
}
