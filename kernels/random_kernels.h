// Kernel signature of random fills, shared by the CPU and CUDA backends.
#pragma once

#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

enum class RandomKind { Uniform, Normal, Integer };
// Fills dst (contiguous) using Philox blocks starting at `first_block`:
// Uniform in [a, b), Normal with mean a and std b, Integer in [a, b).
using RandomFn = void(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed,
                      uint64_t first_block);
extern DispatchStub<RandomFn> random_stub;
// 32-bit words one element uses (1, 2 or 4); element i uses words [i*w, i*w + w) of the
// stream, four words per Philox block.
int64_t random_words_per_element(DType dtype, RandomKind kind);
// Philox blocks a random fill of `numel` elements of `dtype` consumes.
uint64_t random_blocks_needed(int64_t numel, DType dtype, RandomKind kind);

}  // namespace weft
