// The pipeline benchmarks' model (bench/pipeline, bench/replicated_pipeline): eight blocks of
// Linear(width, width) + ReLU in float32, every block the same work, so that any split into
// 1, 2, 4 or 8 stages is balanced. The same seed everywhere: every rank builds the same model.
#pragma once

#include <cstdint>
#include <memory>

#include <weft.h>

namespace weft::bench {

constexpr int kBalancedBlocks = 8;

inline std::shared_ptr<nn::Sequential> balanced_model(int64_t width) {
  Generator gen(7);
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < kBalancedBlocks; ++i)
    model->push_back(std::make_shared<nn::Sequential>(
        std::make_shared<nn::Linear>(width, width, true, TensorOptions(DType::Float32), &gen),
        std::make_shared<nn::ReLU>()));
  return model;
}

}  // namespace weft::bench
