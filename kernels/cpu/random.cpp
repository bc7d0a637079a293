// CPU random fills from Philox blocks (see core/generator.h for the word layout).
#include <cmath>
#include <numbers>

#include "core/generator.h"
#include "kernels/cpu/parallel.h"

namespace weft {

namespace {

// (0, 1] from 32 bits and from 64 bits; never 0, so log() is safe.
inline double unit_open_low_32(uint32_t x) { return (static_cast<double>(x) + 1.0) * 0x1p-32; }
inline double unit_open_low_64(uint32_t hi, uint32_t lo) {
  return (static_cast<double>((uint64_t{hi} << 21) ^ (lo >> 11)) + 1.0) * 0x1p-53;
}

// One element's value from its `words` (1, 2 or 4 of them; see random_blocks_needed).
template <class T>
T draw(const uint32_t* w, RandomKind kind, double a, double b) {
  constexpr bool wide = std::is_same_v<T, double>;
  if (kind == RandomKind::Integer) {
    uint64_t bits = (uint64_t{w[0]} << 32) | w[1];
    auto low = static_cast<int64_t>(a);
    auto range = static_cast<uint64_t>(static_cast<int64_t>(b) - low);
    return static_cast<T>(low + static_cast<int64_t>(bits % range));
  }
  if (kind == RandomKind::Uniform) {
    // [0, 1): 24 bits for float32, 53 for float64.
    double unit = wide ? unit_open_low_64(w[0], w[1]) - 0x1p-53 : static_cast<double>(w[0] >> 8) * 0x1p-24;
    return static_cast<T>(a + (b - a) * unit);
  }
  // Box-Muller, cosine branch: one normal per element keeps element i's value a function
  // of i alone.
  double u1 = wide ? unit_open_low_64(w[0], w[1]) : unit_open_low_32(w[0]);
  double u2 = wide ? unit_open_low_64(w[2], w[3]) : unit_open_low_32(w[1]);
  return static_cast<T>(a + b * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

template <class T>
void fill_random(T* out, int64_t n, RandomKind kind, double a, double b, uint64_t seed, uint64_t first) {
  const int64_t blocks = static_cast<int64_t>(random_blocks_needed(n, dtype_of<T>, kind));
  const int64_t words_per_element = random_words_per_element(dtype_of<T>, kind);
  const int64_t elements_per_block = 4 / words_per_element;
  cpu::parallel_for(0, blocks, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      auto words = philox4x32(seed, first + static_cast<uint64_t>(k));
      for (int64_t j = 0; j < elements_per_block; ++j) {
        int64_t i = k * elements_per_block + j;
        if (i < n) out[i] = draw<T>(words.data() + j * words_per_element, kind, a, b);
      }
    }
  });
}

void random_kernel(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t first_block) {
  WEFT_CHECK(dst.is_contiguous(), "random fill: destination must be contiguous");
  dispatch_dtype(dst.dtype(), DTypeSet::Numeric, "random fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_random(dst.data_ptr<T>(), dst.numel(), kind, a, b, seed, first_block);
  });
}

}  // namespace

DispatchStub<RandomFn> random_stub{"random", &random_kernel};

}  // namespace weft
