// Generator: seeded, counter-based random numbers (Philox-4x32-10).
//
// A counter-based generator makes every random value a pure function of (seed, offset,
// element index): the same on every platform, independent of thread count, and equal
// on CPU and GPU, which use the same formula. A generator only hands out ranges of
// counters; kernels (kernels/random.h, kernels/cpu/random.cpp) turn counters into values.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/host_device.h"

namespace weft {

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

// Every logical device has its own default generator, so that what a random op draws on
// one device (a dropout mask in replica 2) never depends on what another device's thread
// drew first. manual_seed(s) seeds them all, and every one made later: device index 0
// (cpu:0 and cuda:0) gets s itself, so a run on cuda:0 draws what the same run on cpu:0
// draws; index i > 0 gets the first 64 bits of Philox(key = s, counter = i), a stream
// independent of the others (device_seed below).
Generator& default_generator(Device device = kCPU);
void manual_seed(uint64_t seed);
uint64_t device_seed(uint64_t seed, Device device);
// Every default generator made so far, with its device (for checkpoints).
std::vector<std::pair<Device, Generator*>> default_generators();

}  // namespace weft
