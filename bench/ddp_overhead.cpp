// ddp_overhead: what DistributedDataParallel costs, and how much of its communication it
// hides behind backward.
//
//   build/bench/ddp_overhead [--model convnet|resnet|all] [--batch N] [--steps N]
//                            [--ranks 1,2,4] [--bucket-mb MB] [--sync-bn]
//                            [--comm-hook allreduce|fp16|bf16|powersgd] [--optimizer sgd|adam] [--zero]
//                            [--join] [--local-sgd PERIOD] [--device-type cpu|cuda] [--json FILE]
//
// For each world size it starts that many ranks (this executable again, as local processes
// with weft-run's variables, Gloo over loopback; under a launcher it is one rank of that
// job). --device-type cuda puts each rank on GPU LOCAL_RANK mod the GPU count, with NCCL
// (ranks that share a GPU get weft-run's NCCL_HOSTID and socket settings), each timed step
// ends with the device synchronised, and the spans below are device spans (core/trace.h):
// when the GPU ran the work. Each rank trains the model with DDP on its own batch of --batch
// samples (the per-rank batch stays fixed: weak scaling, as DDP is used) and reports the
// median step. At world size 1 the plain model's step is timed too: the ratio is DDP's own
// cost (target <= 1.03x). The hidden fraction: during the timed steps a trace is recorded
// (core/trace.h), and of the time the bucket all-reduces ran (their spans on the group's
// lane) the share that fell while backward was still computing (inside its span on the
// compute lane, before the reducer's final "wait for buckets") is hidden.
// bench/reference/ddp_overhead.py runs PyTorch's DDP (Gloo, CPU) on the same models in the
// same way, and its figures are printed beside weft's. --sync-bn converts the models'
// BatchNorm2d layers (ResNet's) to parallel::SyncBatchNorm first, for what synchronised
// statistics cost; PyTorch 1.13's SyncBatchNorm takes CUDA tensors only, so there is no
// reference for it on CPU ranks. --comm-hook registers one of parallel/ddp/comm_hooks.h's hooks
// on both sides (PyTorch's default_hooks; its Gloo has no bfloat16, so bf16 has no
// reference); powersgd is PowerSGD at rank 1 with error feedback and warm start,
// compressing from the third step (PyTorch 1.13's hangs on Gloo with several buckets, so
// there is no reference for it either; bench/reference/ddp_overhead.py has it, for
// --bucket-mb 25). --optimizer picks SGD with momentum (default) or Adam; --zero wraps it in a
// parallel::ZeroRedundancyOptimizer on both sides (PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer), which adds a broadcast of the parameters
// to each step and divides the optimizer state among the ranks: the last column is the state
// the most loaded rank keeps. --join times the steps inside a join (parallel/process_group/join.h; PyTorch's
// `with Join([ddp, ...])`), on even inputs: what its per-step announcements cost. --local-sgd
// PERIOD trains with local SGD on both sides (parallel/ddp/post_localsgd_hook.h; PyTorch's
// post_localSGD_hook and PostLocalSGDOptimizer): from the third step no gradient crosses the
// wire, and the parameters are averaged after every PERIOD-th step. The steps then differ (one
// in PERIOD averages), so the figure is their mean over a multiple of PERIOD steps (--steps
// rounded up), not the median.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <weft.h>

#include "bench_util.h"
#include "local_ranks.h"

using namespace weft;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string models = "all", ranks = "1,2,4", json;
  int64_t batch = 64;
  int steps = 15;
  // Both models are smaller than one default bucket (25 MB; the first 1 MB), which would
  // leave nothing to overlap: buckets of 32 KB give ConvNet 3 and ResNet 5 (as PyTorch's).
  double bucket_mb = 1.0 / 32;
  bool sync_bn = false;
  std::string comm_hook = "allreduce";
  std::string optimizer = "sgd";
  bool zero = false;
  bool join = false;
  int64_t local_sgd = 0;  // the averaging period; 0: plain DDP
  std::string device_type = "cpu";
};

std::shared_ptr<nn::Module> make_model(const std::string& name) {
  Generator gen(7);
  if (name == "convnet") return std::make_shared<nn::ConvNet>(10, &gen);
  return std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
}

std::shared_ptr<nn::Module> make_model(const std::string& name, bool sync_bn) {
  auto model = make_model(name);
  return sync_bn ? parallel::SyncBatchNorm::convert(model) : model;
}

std::shared_ptr<optim::Optimizer> make_optimizer(const Config& c, std::vector<Tensor> params, bool shard) {
  if (shard) {
    return std::make_shared<parallel::ZeroRedundancyOptimizer>(
        std::move(params), [c](std::vector<Tensor> shard) { return make_optimizer(c, std::move(shard), false); });
  }
  if (c.optimizer == "adam") return std::make_shared<optim::Adam>(std::move(params), optim::AdamOptions{0.001});
  return std::make_shared<optim::SGD>(std::move(params), optim::SGDOptions{0.01, 0.9});
}

// The bytes of optimizer state this rank keeps (a sharded optimizer: its shard's).
double state_bytes(const optim::Optimizer& optimizer) {
  const optim::Optimizer* own = &optimizer;
  if (auto* zero = dynamic_cast<const parallel::ZeroRedundancyOptimizer*>(own)) own = zero->shard_optimizer();
  double bytes = 0;
  if (own)
    for (const auto& [name, t] : own->state_dict().tensors) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

// One training step of `runner` (a model, or DDP around one) on this rank's batch, in ms
// (on a GPU, until the device has done it).
double train_step(nn::Module& runner, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  auto t = Clock::now();
  opt.zero_grad();
  Tensor loss;
  {
    DeviceTraceSpan span("forward", x.device());
    loss = cross_entropy(runner.forward(x), y);
  }
  {
    DeviceTraceSpan span("backward", x.device());  // DDP's final wait for the buckets runs inside
    loss.backward();
  }
  opt.step();
  if (x.device().is_cuda()) synchronize(x.device());
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Median steps of each runner (or the mean, with `use_mean`), their steps taken in turns (a
// slow spell of a shared machine lands on all of them alike).
std::vector<double> time_steps(const std::vector<std::pair<nn::Module*, optim::Optimizer*>>& runners, const Tensor& x,
                               const Tensor& y, int steps, bool use_mean = false) {
  for (int i = 0; i < 3; ++i)
    for (auto [m, o] : runners) train_step(*m, *o, x, y);
  std::vector<std::vector<double>> ms(runners.size());
  for (int i = 0; i < steps; ++i)
    for (size_t k = 0; k < runners.size(); ++k) ms[k].push_back(train_step(*runners[k].first, *runners[k].second, x, y));
  std::vector<double> out;
  for (auto& v : ms) out.push_back(use_mean ? mean(v) : bench::median(v));
  return out;
}

// Of the all-reduce time in the trace, the share that ran while backward was still
// computing: inside a "backward" span but not inside the reducer's "wait for buckets" at its
// end (there backward has nothing left to do but wait).
double hidden_fraction(const std::string& trace_json) {
  auto doc = nlohmann::json::parse(trace_json);
  std::vector<std::pair<double, double>> backward, waiting, reduce;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const double begin = e["ts"].get<double>(), end = begin + e["dur"].get<double>();
    const std::string name = e["name"].get<std::string>();
    if (name == "backward") backward.emplace_back(begin, end);
    if (name == "wait for buckets") waiting.emplace_back(begin, end);
    if (name == "all_reduce") reduce.emplace_back(begin, end);
  }
  auto overlap = [](double b, double e, const std::vector<std::pair<double, double>>& spans) {
    double sum = 0;
    for (auto [sb, se] : spans) sum += std::max(0.0, std::min(e, se) - std::max(b, sb));
    return sum;
  };
  double total = 0, hidden = 0;
  for (auto [b, e] : reduce) {
    total += e - b;
    hidden += overlap(b, e, backward) - overlap(b, e, waiting);
  }
  return total > 0 ? hidden / total : 0;
}

int run_rank(const Config& c) {
  const bool cuda = c.device_type == "cuda";
  parallel::init_process_group(cuda ? "nccl" : "gloo");
  const int rank = parallel::get_rank(), world = parallel::get_world_size();
  const Device device = cuda ? Device::cuda(parallel::read_launch_env().local_rank % cuda_device_count()) : kCPU;
  std::vector<std::string> names =
      c.models == "all" ? std::vector<std::string>{"convnet", "resnet"} : std::vector<std::string>{c.models};
  bench::JsonWriter json;
  for (const std::string& name : names) {
    Generator data(100 + rank);
    Tensor x = randn({c.batch, 1, 28, 28}, DType::Float32, &data).to(device);
    Tensor y = randint(0, 10, {c.batch}, DType::Int64, &data).to(device);
    auto model = make_model(name, c.sync_bn);
    model->to(device);
    parallel::DDPOptions options;
    options.bucket_cap_mb = options.first_bucket_mb = c.bucket_mb;
    parallel::DistributedDataParallel ddp(model, nullptr, options);
    if (c.comm_hook == "powersgd")  // compressing from the third step: every timed step is compressed
      ddp.register_comm_hook(parallel::powersgd_hook(
          std::make_shared<parallel::PowerSGDState>(parallel::PowerSGDOptions{.start_iteration = 2})));
    else if (c.comm_hook != "allreduce")
      ddp.register_comm_hook(parallel::comm_hook_named(c.comm_hook));
    auto optimizer = make_optimizer(c, model->parameters(), c.zero);
    if (c.local_sgd > 0) {  // local from the third step: every timed step is local
      ddp.register_comm_hook(parallel::post_localsgd_hook(std::make_shared<parallel::PostLocalSGDState>(
          parallel::PostLocalSGDOptions{.start_iteration = 2, .post_local_gradient_allreduce = false})));
      optimizer = std::make_shared<parallel::PostLocalSGDOptimizer>(
          optimizer, std::make_shared<parallel::PeriodicModelAverager>(c.local_sgd, 2));
    }
    std::vector<parallel::Joinable*> joinables{&ddp};
    if (auto* zero = dynamic_cast<parallel::ZeroRedundancyOptimizer*>(optimizer.get())) joinables.push_back(zero);
    double step = 0, plain = 0, hidden = 0;
    parallel::join(joinables, [&] {
      if (world == 1) {  // DDP's own cost: against the plain model, in turns
        auto bare = make_model(name);
        bare->to(device);
        auto bare_optimizer = make_optimizer(c, bare->parameters(), false);
        auto ms = time_steps({{&ddp, optimizer.get()}, {bare.get(), bare_optimizer.get()}}, x, y, c.steps,
                             c.local_sgd > 0);
        step = ms[0], plain = ms[1];
      } else if (cuda) {  // timed without the trace (its timing events cost), then a few traced steps
        step = time_steps({{&ddp, optimizer.get()}}, x, y, c.steps, c.local_sgd > 0)[0];
        trace::start();
        time_steps({{&ddp, optimizer.get()}}, x, y, 5, c.local_sgd > 0);
        trace::stop();
        hidden = hidden_fraction(trace::json());
      } else {  // with a trace of the steps, for the hidden share
        trace::start();
        step = time_steps({{&ddp, optimizer.get()}}, x, y, c.steps, c.local_sgd > 0)[0];
        trace::stop();
        hidden = hidden_fraction(trace::json());
      }
    }, {.enable = c.join});
    // The slowest rank's step, the least hidden share, the most optimizer state.
    Tensor stats = tensor(std::vector<double>{step, -hidden, state_bytes(*optimizer)}).to(device);
    parallel::default_group().all_reduce(stats, parallel::ReduceOp::Max)->wait();
    auto v = stats.to(kCPU).to_vector<double>();
    if (rank == 0) {
      std::cout << std::left << std::setw(9) << name << std::right << std::setw(6) << world << std::fixed
                << std::setprecision(2) << std::setw(11) << v[0];
      if (world == 1) std::cout << std::setw(11) << plain << std::setw(9) << v[0] / plain << "x";
      else std::cout << std::setw(11) << "" << std::setw(10) << "";
      // With local SGD only the warm-up's gradients are all-reduced: no share to speak of.
      if (c.local_sgd > 0) std::cout << std::setw(11) << "-";
      else std::cout << std::setw(10) << std::setprecision(0) << (world > 1 ? -v[1] * 100 : 0) << "%";
      std::cout << std::setw(12)
                << std::setprecision(1) << v[2] / 1024 << std::defaultfloat << "\n";
      const std::string key = name + "_" + std::to_string(world) + "ranks_";
      json.add(key + "ddp_step_ms", v[0]);
      if (world == 1) json.add(key + "plain_step_ms", plain);
      if (c.local_sgd == 0) json.add(key + "hidden_fraction", -v[1]);
      json.add(key + "optimizer_state_bytes", v[2]);
    }
  }
  if (rank == 0 && !c.json.empty()) json.write(c.json + "." + std::to_string(world) + "ranks");
  parallel::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "ddp_overhead: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") c.models = next();
    else if (a == "--batch") c.batch = std::stoll(next());
    else if (a == "--steps") c.steps = std::stoi(next());
    else if (a == "--ranks") c.ranks = next();
    else if (a == "--json") c.json = next();
    else if (a == "--bucket-mb") c.bucket_mb = std::stod(next());
    else if (a == "--sync-bn") c.sync_bn = true;
    else if (a == "--comm-hook") c.comm_hook = next();
    else if (a == "--optimizer") c.optimizer = next();
    else if (a == "--zero") c.zero = true;
    else if (a == "--join") c.join = true;
    else if (a == "--local-sgd") c.local_sgd = std::stoll(next());
    else if (a == "--device-type") c.device_type = next();
    else if (a == "--help" || a == "-h") {
      std::cout << "usage: ddp_overhead [--model convnet|resnet|all] [--batch N] [--steps N] [--ranks 1,2,4] "
                   "[--bucket-mb MB] [--sync-bn] [--comm-hook allreduce|fp16|bf16|powersgd] [--optimizer sgd|adam] "
                   "[--zero] [--join] [--local-sgd PERIOD] [--device-type cpu|cuda] [--json FILE]\n";
      return 0;
    } else {
      std::cerr << "ddp_overhead: unknown argument " << a
                << " (expected --model, --batch, --steps, --ranks, --bucket-mb, --sync-bn, --comm-hook, --optimizer, "
                   "--zero, --join, --local-sgd, --device-type, --json)\n";
      return 2;
    }
  }
  if (c.device_type != "cpu" && c.device_type != "cuda") {
    std::cerr << "ddp_overhead: --device-type " << c.device_type << ": expected cpu or cuda\n";
    return 2;
  }
  const bool cuda = c.device_type == "cuda";
  if (bench::skipped_without_backend("ddp_overhead", cuda)) return 0;
  try {
    parallel::comm_hook_named(c.comm_hook);  // an unknown name fails here, once
    if (c.optimizer != "sgd" && c.optimizer != "adam") {
      std::cerr << "ddp_overhead: --optimizer " << c.optimizer << ": expected sgd or adam\n";
      return 2;
    }
    if (c.local_sgd < 0 || (c.local_sgd > 0 && (c.comm_hook != "allreduce" || c.zero || c.join))) {
      std::cerr << "ddp_overhead: --local-sgd takes a period >= 1 and goes with neither --comm-hook, --zero nor "
                   "--join\n";
      return 2;
    }
    if (c.local_sgd > 0) c.steps = static_cast<int>((c.steps + c.local_sgd - 1) / c.local_sgd * c.local_sgd);
    if (parallel::launched_as_rank()) return run_rank(c);
    std::cout << "# ddp_overhead: DDP ("
              << (cuda ? "NCCL, ranks on " + std::to_string(cuda_device_count()) + " GPU(s)"
                       : std::string("Gloo, CPU ranks"))
              << " as processes on this machine), batch " << c.batch
              << " per rank, buckets of " << c.bucket_mb << " MB" << (c.sync_bn ? ", SyncBatchNorm" : "")
              << (c.comm_hook != "allreduce" ? ", " + c.comm_hook + " communication hook" : "")
              << ", " << (c.optimizer == "adam" ? "Adam" : "SGD with momentum")
              << (c.zero ? " sharded by ZeroRedundancyOptimizer" : "")
              << (c.join ? ", steps inside a join (even inputs)" : "")
              << (c.local_sgd > 0 ? ", local SGD averaging every " + std::to_string(c.local_sgd) + " steps" : "")
              << (c.local_sgd > 0 ? ", mean of " : ", median of ") << c.steps
              << " steps; " << num_threads()
              << " CPU threads shared by the ranks\n"
              << "# model    ranks   ddp step   plain step    ratio    hidden   opt state\n"
              << "#                     (ms)        (ms)              (all-reduce     (KB, most\n"
              << "#                                                   in backward)    on a rank)" << std::endl;
    int failed = 0;
    std::stringstream list(c.ranks);
    std::string item;
    while (std::getline(list, item, ','))
      failed |= bench::run_as_local_ranks(argv[0], argv, std::stoi(item), /*share_gpus=*/cuda);
    if (c.sync_bn) {
      std::cout << "# PyTorch reference not run with --sync-bn (PyTorch 1.13's SyncBatchNorm takes CUDA tensors "
                   "only)\n";
      return failed;
    }
    if (c.comm_hook == "bf16") {
      std::cout << "# PyTorch reference not run with --comm-hook bf16 (PyTorch 1.13's Gloo has no bfloat16)\n";
      return failed;
    }
    if (c.comm_hook == "powersgd") {
      std::cout << "# PyTorch reference not run with --comm-hook powersgd (PyTorch 1.13's powerSGD_hook never finishes "
                   "on Gloo ranks with more than one bucket: its continuations wait for nested all-reduces)\n";
      return failed;
    }
    auto torch = bench::run_reference("ddp_overhead.py", "--model " + c.models + " --batch " + std::to_string(c.batch) +
                                                             " --steps " + std::to_string(c.steps) + " --ranks " +
                                                             c.ranks + " --threads " + std::to_string(num_threads()) +
                                                             " --bucket-mb " + std::to_string(c.bucket_mb) +
                                                             " --comm-hook " + c.comm_hook + " --optimizer " +
                                                             c.optimizer + (c.zero ? " --zero" : "") +
                                                             (c.join ? " --join" : "") +
                                                             " --local-sgd " + std::to_string(c.local_sgd) +
                                                             " --device-type " + c.device_type);
    if (torch.empty()) {
      std::cout << "# PyTorch reference not run (no python3 with torch"
                << (cuda ? " built with CUDA" : "") << "; tools/install-deps --bench)\n";
    } else {
      std::cout << "# PyTorch " << (cuda ? "DDP (NCCL, GPU)" : "1.13 DDP (Gloo, CPU)") << ", the same way:";
      for (const auto& [key, value] : torch) std::cout << " " << key << " " << std::fixed << std::setprecision(2) << value;
      std::cout << std::defaultfloat << "\n";
    }
    return failed;
  } catch (const std::exception& e) {
    std::cerr << "ddp_overhead: " << e.what() << "\n";
    return 1;
  }
}
