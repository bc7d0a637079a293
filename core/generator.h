// Generator: seeded, counter-based random numbers (Philox-4x32-10).
//
// A counter-based generator makes every random value a pure function of (seed, offset,
// element index): the same on every platform, independent of thread count, and equal
// on CPU and GPU once the CUDA kernels use the same formula. A generator only hands out
// ranges of counters; kernels (kernels/cpu/random.cpp) turn counters into values.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif

// One Philox-4x32-10 block: four 32-bit words for (key = seed, counter).
WEFT_HOST_DEVICE inline std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter_lo,
                                                           uint64_t counter_hi = 0) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t{0xD2511F53} * c0, p1 = uint64_t{0xCD9E8D57} * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

class Generator {
 public:
  explicit Generator(uint64_t seed = kDefaultSeed) : seed_(seed) {}
  static constexpr uint64_t kDefaultSeed = 0x5EED;

  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t offset() const;
  void set_offset(uint64_t offset);
  // Reserves `blocks` Philox blocks; returns (seed, first block) for a kernel to use.
  std::pair<uint64_t, uint64_t> reserve(uint64_t blocks);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

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

Tensor rand(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options = DType::Int64,
               Generator* gen = nullptr);
Tensor randperm(int64_t n, const TensorOptions& options = DType::Int64, Generator* gen = nullptr);
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);

}  // namespace weft
