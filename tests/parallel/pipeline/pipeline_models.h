// The Sequential the pipeline tests split into stages (test_pipeline.cpp and the ranks
// of pipeline_worker.cpp build the same one from the same seed).
#pragma once

#include <memory>

#include <weft.h>

namespace weft::test {

// Four Linear layers with ReLUs between (7 layers), float64.
inline std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed, int64_t width = 16, int64_t classes = 10) {
  Generator gen(seed);
  const TensorOptions f64(DType::Float64);
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Linear>(8, width, true, f64, &gen));
  for (int i = 0; i < 2; ++i) {
    seq->push_back(std::make_shared<nn::ReLU>());
    seq->push_back(std::make_shared<nn::Linear>(width, width, true, f64, &gen));
  }
  seq->push_back(std::make_shared<nn::ReLU>());
  seq->push_back(std::make_shared<nn::Linear>(width, classes, true, f64, &gen));
  return seq;
}

// Stage 0 of a pipeline with balance {5, 1, 1, 1} (or {5, ...}) is wide (Linear(8, 512), ReLU,
// Linear(512, 512), ReLU, Linear(512, 4)) and hands on a narrow output, so that its
// activations dominate what it sends: the memory tests measure them.
inline std::shared_ptr<nn::Sequential> make_wide_then_narrow(Generator* gen) {
  const TensorOptions f64(DType::Float64);
  return std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(8, 512, true, f64, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(512, 512, true, f64, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(512, 4, true, f64, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(4, 4, true, f64, gen), std::make_shared<nn::Linear>(4, 10, true, f64, gen));
}

// The peak memory of `device` during a second step of `pipe`, above what it held before that
// step (the first one makes the gradients).
template <class Pipe, class Criterion>
int64_t step_peak_above(Pipe& pipe, const Tensor& x, const Tensor& y, const Criterion& criterion, Device device) {
  pipe.step(x, y, criterion);
  const int64_t base = memory_stats(device).bytes_in_use;
  reset_peak_memory_stats(device);
  pipe.step(x, y, criterion);
  return memory_stats(device).peak_bytes_in_use - base;
}

}  // namespace weft::test
