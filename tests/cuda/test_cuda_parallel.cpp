// The parallel layer on CUDA logical devices (CTest runs it once as is and once with
// WEFT_VIRTUAL_DEVICES=4, four logical devices on however many GPUs there are): comm's
// ops against the same ops on CPU devices, DataParallel against one GPU, repeatable
// dropout, pipelines against the same model on the CPU, and device spans in a trace. Cases
// that need two devices say so and pass when there is one.
#include "cuda_test_util.h"

#include <filesystem>
#include <unistd.h>

#include "core/trace.h"
#include "trace_reading.h"

#include "parallel/local/comm.h"
#include "parallel/local/data_parallel.h"
#include "parallel/local/functions.h"
#include "parallel/pipeline/pipeline.h"

using namespace weft;
using namespace weft::test;

namespace {

std::vector<Device> all_gpus() {
  std::vector<Device> out;
  for (int i = 0; i < cuda_device_count(); ++i) out.push_back(gpu(i));
  return out;
}

std::vector<Device> cpus(size_t n) {
  std::vector<Device> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(DeviceType::CPU, static_cast<int>(i));
  return out;
}

bool need_two(const std::vector<Device>& gpus) {
  if (gpus.size() >= 2) return true;
  MESSAGE("one logical CUDA device: run with WEFT_VIRTUAL_DEVICES=4 for the multi-device cases");
  return false;
}

}  // namespace

TEST_CASE("comm on CUDA devices equals comm on CPU devices, bit for bit") {
  const auto gpus = all_gpus();
  if (!need_two(gpus)) return;
  const auto hosts = cpus(gpus.size());
  std::vector<Tensor> host_tensors = {random({33, 7}, DType::Float32, 1), random({5}, DType::Float64, 2),
                                      randint(0, 50, {11}, DType::Int64), noncontiguous(random({6, 4}, DType::Float32, 3))};
  std::vector<Tensor> gpu_tensors;
  for (const Tensor& t : host_tensors) gpu_tensors.push_back(t.to(gpus[0]));
  for (int64_t buffer : {int64_t{1} << 20, int64_t{64}}) {
    auto on_gpus = parallel::comm::broadcast_coalesced(gpu_tensors, gpus, buffer);
    for (size_t d = 0; d < gpus.size(); ++d)
      for (size_t j = 0; j < host_tensors.size(); ++j) {
        CHECK(on_gpus[d][j].device() == gpus[d]);
        CHECK_MESSAGE(bitwise_difference(on_gpus[d][j], host_tensors[j]) == "", bitwise_difference(on_gpus[d][j], host_tensors[j]));
      }
  }
  std::vector<Tensor> parts_gpu, parts_cpu;
  for (size_t d = 0; d < gpus.size(); ++d) {
    Tensor part = random({1000}, DType::Float32, 10 + d);
    parts_gpu.push_back(part.to(gpus[d]));
    parts_cpu.push_back(part.to(hosts[d]));
  }
  Tensor sum_gpu = parallel::comm::reduce_add(parts_gpu, gpus.back());
  CHECK(sum_gpu.device() == gpus.back());
  CHECK(bitwise_difference(sum_gpu, parallel::comm::reduce_add(parts_cpu, kCPU)) == "");
  Tensor batch = random({13, 3, 5}, DType::Float32, 20);
  auto pieces = parallel::comm::scatter(batch.to(gpus[0]), gpus);
  auto host_pieces = parallel::comm::scatter(batch, hosts);
  REQUIRE(pieces.size() == host_pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    CHECK(pieces[i].device() == gpus[i]);
    CHECK(bitwise_difference(pieces[i], host_pieces[i]) == "");
  }
  CHECK(bitwise_difference(parallel::comm::gather(pieces, gpus.back()), batch) == "");
  CHECK(bitwise_difference(parallel::comm::gather(pieces, kCPU), batch) == "");  // and back to the host
}

TEST_CASE("DataParallel over every CUDA device trains like one GPU") {
  const auto gpus = all_gpus();
  if (!need_two(gpus)) return;
  Generator gen(30);
  auto reference = std::make_shared<nn::MLP>(24, std::vector<int64_t>{32}, 10, 0.0, &gen);
  reference->to(gpus[0]);
  auto copy = reference->clone();
  parallel::DataParallel dp(copy, gpus);
  optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD sgd_dp(copy->parameters(), optim::SGDOptions{0.05, 0.9});
  for (int s = 0; s < 10; ++s) {
    Generator data(40 + s);
    Tensor x = randn({19, 24}, DType::Float32, &data).to(gpus[0]);
    Tensor y = randint(0, 10, {19}, DType::Int64, &data).to(gpus[0]);
    sgd_ref.zero_grad();
    cross_entropy(reference->forward(x), y).backward();
    sgd_ref.step();
    sgd_dp.zero_grad();
    cross_entropy(dp(x), y).backward();
    sgd_dp.step();
  }
  auto a = reference->parameters(), b = copy->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i].device() == gpus[0]);
    CHECK_CLOSE(b[i].to(kCPU), a[i].to(kCPU), 1e-5, 1e-4);
  }
}

TEST_CASE("a pipeline over every CUDA device trains like the model on the CPU: each schedule, recomputing or not") {
  const auto gpus = all_gpus();
  if (!need_two(gpus)) return;
  auto make = [] {
    Generator gen(31);
    const TensorOptions f64(DType::Float64);
    auto seq = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 4; ++i) {
      seq->push_back(std::make_shared<nn::Linear>(i == 0 ? 24 : 32, 32, true, f64, &gen));
      seq->push_back(std::make_shared<nn::ReLU>());
    }
    seq->push_back(std::make_shared<nn::Linear>(32, 10, true, f64, &gen));
    return seq;
  };
  const int m = 2 * static_cast<int>(gpus.size());
  for (const char* schedule : {"gpipe", "1f1b", "interleaved"})
    for (const char* recompute : {"never", "always"}) {
      CAPTURE(schedule);
      CAPTURE(recompute);
      auto reference = make();
      parallel::pipeline::Pipeline pipe(make(), {.devices = gpus, .micro_batches = m, .schedule = schedule,
                                                 .virtual_stages = std::string(schedule) == "interleaved" ? 2 : 1,
                                                 .activation_checkpointing = recompute});
      optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
      optim::SGD sgd_pipe(pipe.parameters(), optim::SGDOptions{0.05, 0.9});
      for (int s = 0; s < 10; ++s) {
        Generator data(50 + s);
        Tensor x = randn({3 * m + 1, 24}, DType::Float64, &data);
        Tensor y = randint(0, 10, {3 * m + 1}, DType::Int64, &data);
        sgd_ref.zero_grad();
        cross_entropy(reference->forward(x), y).backward();
        sgd_ref.step();
        sgd_pipe.zero_grad();
        auto result = pipe.step(x.to(gpus[0]), y.to(gpus[0]),
                                [](const Tensor& out, const Tensor& t) { return cross_entropy(out, t); });
        sgd_pipe.step();
        CHECK(result.loss.device() == pipe.stage_device(pipe.num_stages() - 1));
      }
      auto a = reference->named_parameters(), b = pipe.named_parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(a[i].first);
        CHECK(b[i].second.device().is_cuda());
        CHECK_CLOSE(b[i].second.to(kCPU), a[i].second, 1e-9, 1e-9);
      }
    }
}

TEST_CASE("DataParallel with dropout on CUDA devices repeats bit for bit") {
  const auto gpus = all_gpus();
  if (!need_two(gpus)) return;
  Generator gen(50);
  nn::MLP base(16, {64}, 10, 0.5, &gen);
  auto run = [&] {
    manual_seed(7);
    auto model = base.clone(gpus[0]);
    parallel::DataParallel dp(model, gpus);
    optim::SGD sgd(model->parameters(), optim::SGDOptions{0.1});
    for (int s = 0; s < 3; ++s) {
      Generator data(60 + s);
      sgd.zero_grad();
      cross_entropy(dp(randn({21, 16}, DType::Float32, &data).to(gpus[0])),
                    randint(0, 10, {21}, DType::Int64, &data).to(gpus[0]))
          .backward();
      sgd.step();
    }
    return model->parameters();
  };
  auto a = run(), b = run();
  for (size_t i = 0; i < a.size(); ++i) CHECK(bitwise_difference(a[i], b[i]) == "");
}

TEST_CASE("a DeviceTraceSpan shows when the GPU ran the work; a host span, when it was queued") {
  const Device device = gpu(0);
  const Tensor a = randn({4096, 4096}, DType::Float32).to(device), b = randn({4096, 4096}, DType::Float32).to(device);
  matmul(a, b);  // cuBLAS's handle and workspace before the trace
  synchronize(device);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("weft_test_cuda_trace_" + std::to_string(::getpid()))).string();
  trace::start();
  {
    TraceSpan queued("queued", kCPU);
    DeviceTraceSpan ran("ran", device);
    for (int i = 0; i < 4; ++i) matmul(a, b);  // 4 x 137 GFLOP: milliseconds on any GPU
  }
  synchronize(device);
  trace::write(path);
  const auto queued = test::traced_spans(path, "queued"), ran = test::traced_spans(path, "ran");
  std::filesystem::remove(path);
  REQUIRE(queued.size() == 1);
  REQUIRE(ran.size() == 1);
  CHECK(ran[0].lane == "default stream");
  CHECK(ran[0].ts >= queued[0].ts - 2);  // the kernels start after they are queued (2 us: rounding)
  CHECK(ran[0].dur > queued[0].dur);     // and run longer than queueing them takes
  CHECK(ran[0].ts + ran[0].dur > queued[0].ts + queued[0].dur);
}
