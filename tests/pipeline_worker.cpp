// One rank of the multi-process pipeline tests (tests/test_pipeline.cpp starts several):
//
//   pipeline_worker SCHEDULE MICRO_BATCHES [VIRTUAL_STAGES]   (RANK, WORLD_SIZE, MASTER_* set)
//   pipeline_worker mismatch      (rank 1 asks for other micro-batches: every rank must fail)
//
// Every rank builds the whole model from the same seed and trains it alone on one device as
// the reference, and its stages of it as a DistributedPipeline; both see the same batches
// (a function of the step). After 20 steps each rank checks its stages' parameters against
// the reference's of the same names, and the last stage's rank the loss of every step.
// Prints "FAIL: ..." lines and exits 1 on a failure. WEFT_TEST_BACKEND=nccl runs on CUDA.
#include <cstdlib>
#include <iostream>
#include <string>

#include <weft.h>

#include "parallel/pipeline/distributed_pipeline.h"
#include "pipeline_models.h"
#include "worker_backend.h"

using namespace weft;
using namespace weft::parallel;

int main(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) != "mismatch" && argc < 3)) {
    std::cerr << "usage: pipeline_worker SCHEDULE MICRO_BATCHES [VIRTUAL_STAGES] | pipeline_worker mismatch\n";
    return 2;
  }
  if (std::string(argv[1]) == "mismatch") {
    try {
      init_process_group(test::worker_backend());
      pipeline::DistributedPipeline pipe(test::make_mlp(7), default_group_ptr(),
                                         {.device = test::worker_device(), .micro_batches = get_rank() == 1 ? 3 : 4});
      std::cout << "FAIL: rank " << get_rank() << " built a pipeline the other ranks disagree with" << std::endl;
      return 1;
    } catch (const std::exception& e) {
      std::cout << "error: " << e.what() << std::endl;
      destroy_process_group();
      return 0;
    }
  }
  const std::string schedule = argv[1];
  const int micro_batches = std::atoi(argv[2]), virtual_stages = argc > 3 ? std::atoi(argv[3]) : 1;
  int failures = 0;
  try {
    init_process_group(test::worker_backend());
    const int rank = get_rank();
    const Device device = test::worker_device();
    auto reference = test::make_mlp(7);
    reference->to(device);
    pipeline::DistributedPipeline pipe(test::make_mlp(7), default_group_ptr(),
                                       {.device = device, .micro_batches = micro_batches, .schedule = schedule,
                                        .virtual_stages = virtual_stages});
    optim::SGD sgd_ref(reference->parameters(), optim::SGDOptions{0.05, 0.9});
    optim::SGD sgd_pipe(pipe.parameters(), optim::SGDOptions{0.05, 0.9});
    auto criterion = [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); };
    for (int s = 0; s < 20; ++s) {
      Generator gen(1000 + s);
      Tensor x = randn({13, 8}, TensorOptions(DType::Float64), &gen).to(device);
      Tensor y = randint(0, 10, {13}, DType::Int64, &gen).to(device);
      sgd_ref.zero_grad();
      Tensor expected = criterion(reference->forward(x), y);
      expected.backward();
      sgd_ref.step();
      sgd_pipe.zero_grad();
      pipeline::StepResult result = pipe.step(x, y, criterion);
      sgd_pipe.step();
      if (pipe.holds_stage(pipe.num_stages() - 1)) {
        const double got = result.loss.item(), want = expected.item();
        if (std::abs(got - want) > 1e-10 * (1 + std::abs(want))) {
          std::cout << "FAIL: rank " << rank << ": step " << s << " loss " << got << ", expected " << want << std::endl;
          ++failures;
        }
      } else if (result.loss.defined()) {
        std::cout << "FAIL: rank " << rank << " returned a loss without the last stage" << std::endl;
        ++failures;
      }
    }
    const auto want = reference->named_parameters();
    const auto got = pipe.named_parameters();
    if (got.empty()) std::cout << "FAIL: rank " << rank << " holds no parameters" << std::endl, ++failures;
    for (const auto& [name, value] : got) {
      const std::string& key = name;  // Clang 14 cannot capture a structured binding
      const auto it = std::find_if(want.begin(), want.end(), [&](const auto& p) { return p.first == key; });
      const double diff = it == want.end() ? 1.0 : amax(abs(sub(value, it->second))).item();
      if (diff > 1e-10) {
        std::cout << "FAIL: rank " << rank << ": parameter " << name << " differs by " << diff << std::endl;
        ++failures;
      }
    }
    std::cout << "rank " << rank << ": " << got.size() << " parameters of stages checked after 20 steps ("
              << schedule << ", " << micro_batches << " micro-batches)" << std::endl;
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "FAIL: " << e.what() << std::endl;
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
