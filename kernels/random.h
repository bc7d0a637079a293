// Random tensors: uniform, normal and integer draws, and permutations.
//
// Each factory reserves a range of Philox counters from a generator (core/generator.h) and
// has the device's kernel turn them into values, so a value depends only on (seed, offset,
// element index): the same on every thread count and on the CPU and the GPU. Without a
// generator of its own, a factory draws from the default generator of the device it
// fills (default_generator(device)).
#pragma once

#include "core/generator.h"
#include "core/tensor.h"

namespace weft {

Tensor rand(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options = DType::Int64,
               Generator* gen = nullptr);
Tensor randperm(int64_t n, const TensorOptions& options = DType::Int64, Generator* gen = nullptr);
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);

}  // namespace weft
