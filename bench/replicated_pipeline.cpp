// replicated_pipeline: what averaging a replicated pipeline's gradients costs, and how much of
// it the stages' reducers hide (Note [Replicated stages] in parallel/pipeline/distributed_pipeline.h).
//
//   build/bench/replicated_pipeline [--replicas R] [--stages P] [--micro-batches M] [--batch N]
//                                   [--width N] [--steps N] [--bucket-mb MB] [--first-bucket-mb MB]
//                                   [--schedule gpipe|1f1b|interleaved] [--device-type cpu|cuda]
//                                   [--json FILE]
//
// R replicas of a pipeline of P ranks (--stages): R x P ranks (this executable again, as local
// processes with weft-run's variables: Gloo over loopback, or NCCL with --device-type cuda, ranks
// on GPU LOCAL_RANK mod the GPU count; under a launcher it is one rank of that job), laid out by
// pipeline_mesh(R), train bench/balanced_model.h's model (eight blocks of Linear(width, width) +
// ReLU, float32; interleaved: two stages per rank) on N samples per replica and step, in two ways,
// their steps taken in turns:
//   after the step: a DistributedPipeline over the rank's pipeline, then
//     parallel::average_gradients over its replica group (one all-reduce per dtype once the
//     schedule is done: data parallelism by hand);
//   in the backward: a DistributedPipeline built from the mesh, whose reducers launch each
//     bucket's all-reduce during the backward of the stage's last micro-batch and wait for them
//     when the schedule is done (buckets of --bucket-mb, the first of --first-bucket-mb: DDP's
//     25 and 1 by default).
// Reported: the median step (the slowest rank's; on a GPU until the device is done), and per
// pipeline position, from a trace of a few more steps of each: the averaging the step waits for
// (its "average gradients" spans, ms a step, the most over the replicas; on a GPU device spans,
// from the compute stream reaching the wait to the last all-reduce's end) and the share of the
// position's all-reduce time that ran outside those waits (hidden, the least over the replicas).
// The check: both ways end with the same parameters after the same batches (float32 rounding).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <weft.h>

#include "balanced_model.h"
#include "bench_util.h"
#include "local_ranks.h"
#include "parallel/pipeline/distributed_pipeline.h"
#include "parallel/pipeline/pipeline_mesh.h"

using namespace weft;
using namespace weft::parallel::pipeline;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kBlocks = bench::kBalancedBlocks;

struct Config {
  int replicas = 2, stages = 2, micro_batches = 4, steps = 10;
  int64_t batch = 64, width = 512;
  double bucket_mb = 25, first_bucket_mb = 1;
  std::string schedule = "1f1b", device_type = "cpu", json;
};

// One way of averaging: its pipeline, optimizer, and whether it averages after the step.
struct Way {
  std::shared_ptr<DistributedPipeline> pipe;
  std::shared_ptr<optim::SGD> sgd;
  parallel::ProcessGroup* average_after = nullptr;  // the replica group, for "after the step"
  std::vector<Tensor> averaged;                      // "after the step": the parameters it averages
};

// One step of `way` on this replica's batch, in ms.
double train_step(Way& way, const Tensor& x, const Tensor& y, Device device) {
  const auto t = Clock::now();
  way.sgd->zero_grad();
  way.pipe->step(x, y, [](const Tensor& out, const Tensor& target) { return mse_loss(out, target); });
  if (way.average_after) {
    DeviceTraceSpan span("average gradients", device);  // as the pipeline's own (on a GPU: device time)
    parallel::average_gradients(way.averaged, *way.average_after);
  }
  way.sgd->step();
  if (device.is_cuda()) synchronize(device);
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// From a trace of `steps` steps: the ms a step spent waiting in "average gradients" spans, and
// the share of the all-reduce spans' time outside them.
std::pair<double, double> exposure(const std::string& trace_json, int steps) {
  auto doc = nlohmann::json::parse(trace_json);
  std::vector<std::pair<double, double>> waits, reduces;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const double begin = e["ts"].get<double>(), end = begin + e["dur"].get<double>();
    if (e["name"] == "average gradients") waits.emplace_back(begin, end);
    if (e["name"] == "all_reduce") reduces.emplace_back(begin, end);
  }
  double waited = 0, total = 0, inside = 0;
  for (auto [b, e] : waits) waited += e - b;
  for (auto [b, e] : reduces) {
    total += e - b;
    for (auto [wb, we] : waits) inside += std::max(0.0, std::min(e, we) - std::max(b, wb));
  }
  return {waited / 1e3 / steps, total > 0 ? 1 - inside / total : 0};
}

int run_rank(const Config& c) {
  const bool cuda = c.device_type == "cuda";
  parallel::init_process_group(cuda ? "nccl" : "gloo");
  const int rank = parallel::get_rank();
  const Device device = cuda ? Device::cuda(parallel::read_launch_env().local_rank % cuda_device_count()) : kCPU;
  const PipelineMesh mesh = pipeline_mesh(c.replicas);
  WEFT_CHECK(mesh.pipeline->size() == c.stages, "replicated_pipeline: ", parallel::get_world_size(), " ranks make ",
             c.replicas, " replicas of ", mesh.pipeline->size(), " ranks, not of ", c.stages);
  const DistributedPipelineOptions options{.device = device, .bucket_cap_mb = c.bucket_mb,
                                           .first_bucket_mb = c.first_bucket_mb, .micro_batches = c.micro_batches,
                                           .schedule = c.schedule,
                                           .virtual_stages = c.schedule == "interleaved" ? 2 : 1};
  Way after, inside;
  after.pipe = std::make_shared<DistributedPipeline>(bench::balanced_model(c.width), mesh.pipeline, options);
  after.average_after = mesh.replicas_group.get();
  after.averaged = after.pipe->parameters();  // every one trains
  inside.pipe = std::make_shared<DistributedPipeline>(bench::balanced_model(c.width), mesh, options);
  for (Way* way : {&after, &inside})
    way->sgd = std::make_shared<optim::SGD>(way->pipe->parameters(), optim::SGDOptions{0.01, 0.9});
  // This replica's batches (each replica its own samples), the same for both ways.
  Generator data(100 + mesh.replica);
  const Tensor x = randn({c.batch, c.width}, DType::Float32, &data).to(device);
  const Tensor y = randn({c.batch, c.width}, DType::Float32, &data).to(device);
  for (int i = 0; i < 3; ++i)
    for (Way* way : {&after, &inside}) train_step(*way, x, y, device);
  std::vector<double> ms_after, ms_inside;
  for (int i = 0; i < c.steps; ++i) {
    ms_after.push_back(train_step(after, x, y, device));
    ms_inside.push_back(train_step(inside, x, y, device));
  }
  constexpr int kTraced = 5;
  std::pair<double, double> seen[2];
  for (int k = 0; k < 2; ++k) {
    trace::start();
    for (int i = 0; i < kTraced; ++i) train_step(k == 0 ? after : inside, x, y, device);
    trace::stop();
    seen[k] = exposure(trace::json(), kTraced);
  }
  // The same steps on the same batches: the same parameters.
  double differs = 0;
  const auto a = after.pipe->parameters(), b = inside.pipe->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = amax(abs(sub(a[i], b[i]))).to(kCPU).item();
    if (!(d <= differs)) differs = std::isfinite(d) ? d : std::numeric_limits<double>::max();  // NaN fails too
  }
  // Over the job, by maximum: the steps, then per position the waits and the negated hidden
  // shares (entries of other positions stay at the lowest double).
  const int P = c.stages;
  std::vector<double> v(3 + 4 * static_cast<size_t>(P), std::numeric_limits<double>::lowest());
  v[0] = bench::median(ms_after), v[1] = bench::median(ms_inside), v[2] = differs;
  for (int k = 0; k < 2; ++k) {
    v[3 + (k * P) + mesh.position] = seen[k].first;
    v[3 + (2 + k) * P + mesh.position] = -seen[k].second;
  }
  Tensor all = tensor(v).to(device);
  parallel::default_group().all_reduce(all, parallel::ReduceOp::Max)->wait();
  v = all.to(kCPU).to_vector<double>();
  if (rank == 0) {
    const int world = parallel::get_world_size();
    std::cout << "# replicated_pipeline: " << c.replicas << " replicas of a pipeline of " << c.stages << " ranks ("
              << (cuda ? "NCCL, " + std::to_string(world) + " ranks on " + std::to_string(cuda_device_count()) +
                             " GPU(s)"
                       : "Gloo, " + std::to_string(world) + " CPU ranks")
              << "), " << kBlocks << " blocks of Linear(" << c.width << ", " << c.width << ") + ReLU (float32), "
              << c.schedule << ", " << c.micro_batches << " micro-batches of a batch of " << c.batch
              << " per replica, buckets of " << c.bucket_mb << " MB (the first " << c.first_bucket_mb
              << " MB); median of " << c.steps << " steps; " << num_threads() << " CPU threads on rank 0\n"
              << "# averaging       step (ms)   per pipeline rank: wait for the average (ms a step), "
                 "all-reduce hidden\n";
    bench::JsonWriter json;
    const char* names[] = {"after the step", "in the backward"};
    const char* keys[] = {"after_step", "in_backward"};
    for (int k = 0; k < 2; ++k) {
      std::cout << std::left << std::setw(17) << names[k] << std::right << std::fixed << std::setprecision(2)
                << std::setw(10) << v[k] << "   ";
      json.add(std::string(keys[k]) + "_step_ms", v[k]);
      for (int p = 0; p < P; ++p) {
        const double waited = v[3 + k * P + p], hidden = -v[3 + (2 + k) * P + p];
        std::cout << "  " << std::setprecision(2) << std::setw(6) << waited << " ms " << std::setprecision(0)
                  << std::setw(4) << hidden * 100 << "%";
        json.add(std::string(keys[k]) + "_position" + std::to_string(p) + "_wait_ms", waited);
        json.add(std::string(keys[k]) + "_position" + std::to_string(p) + "_hidden_fraction", hidden);
      }
      std::cout << "\n";
    }
    std::cout << std::defaultfloat << std::setprecision(6)
              << "# check: the two ways' parameters differ by at most " << v[2]
              << (v[2] <= 1e-4 ? " (float32 rounding)" : " (FAILED: more than 1e-4)") << std::endl;
    json.add("parameters_max_abs_diff", v[2]);
    if (!c.json.empty()) json.write(c.json);
  }
  parallel::destroy_process_group();
  return v[2] <= 1e-4 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  const char* usage =
      "usage: replicated_pipeline [--replicas R] [--stages P] [--micro-batches M] [--batch N] [--width N] "
      "[--steps N] [--bucket-mb MB] [--first-bucket-mb MB] [--schedule gpipe|1f1b|interleaved] "
      "[--device-type cpu|cuda] [--json FILE]\n";
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--replicas") c.replicas = std::stoi(next());
      else if (a == "--stages") c.stages = std::stoi(next());
      else if (a == "--micro-batches") c.micro_batches = std::stoi(next());
      else if (a == "--batch") c.batch = std::stoll(next());
      else if (a == "--width") c.width = std::stoll(next());
      else if (a == "--steps") c.steps = std::stoi(next());
      else if (a == "--bucket-mb") c.bucket_mb = std::stod(next());
      else if (a == "--first-bucket-mb") c.first_bucket_mb = std::stod(next());
      else if (a == "--schedule") c.schedule = next();
      else if (a == "--device-type") c.device_type = next();
      else if (a == "--json") c.json = next();
      else if (a == "--help" || a == "-h") {
        std::cout << usage;
        return 0;
      } else {
        throw std::invalid_argument("unknown argument " + a);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "replicated_pipeline: " << e.what() << "\n" << usage;
    return 2;
  }
  const int per_rank = c.schedule == "interleaved" ? 2 : 1;
  if ((c.device_type != "cpu" && c.device_type != "cuda") ||
      (c.schedule != "gpipe" && c.schedule != "1f1b" && c.schedule != "interleaved") || c.replicas < 2 ||
      c.stages < 1 || kBlocks % (c.stages * per_rank) != 0 || c.steps < 1 || c.batch < c.micro_batches) {
    std::cerr << "replicated_pipeline: expected --device-type cpu|cuda, --schedule gpipe|1f1b|interleaved, "
              << "--replicas >= 2, stages (2 per rank interleaved) dividing " << kBlocks
              << ", --steps >= 1 and --batch >= --micro-batches\n";
    return 2;
  }
  const bool cuda = c.device_type == "cuda";
  if (bench::skipped_without_backend("replicated_pipeline", cuda)) return 0;
  try {
    if (parallel::launched_as_rank()) return run_rank(c);
    return bench::run_as_local_ranks(argv[0], argv, c.replicas * c.stages, /*share_gpus=*/cuda);
  } catch (const std::exception& e) {
    std::cerr << "replicated_pipeline: " << e.what() << "\n";
    return 1;
  }
}
