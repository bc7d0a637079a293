// The Sequential the pipeline tests split into stages (tests/test_pipeline.cpp and the ranks
// of tests/pipeline_worker.cpp build the same one from the same seed).
#pragma once

#include <memory>

#include <weft.h>

namespace weft::test {

// Four Linear layers with ReLUs between (7 layers), float64.
inline std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed, int64_t width = 16) {
  Generator gen(seed);
  const TensorOptions f64(DType::Float64);
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Linear>(8, width, true, f64, &gen));
  for (int i = 0; i < 2; ++i) {
    seq->push_back(std::make_shared<nn::ReLU>());
    seq->push_back(std::make_shared<nn::Linear>(width, width, true, f64, &gen));
  }
  seq->push_back(std::make_shared<nn::ReLU>());
  seq->push_back(std::make_shared<nn::Linear>(width, 10, true, f64, &gen));
  return seq;
}

}  // namespace weft::test
