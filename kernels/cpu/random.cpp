// CPU random fills from Philox blocks (see kernels/random_kernels.h for the word layout).
#include <numbers>

#include "core/generator.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/random_kernels.h"
#include "kernels/random_transforms.h"

namespace weft {

// random_normal spells 2 pi as a literal (its header stays C++17 for nvcc).
static_assert(0x1.921fb54442d18p+2 == 2.0 * std::numbers::pi);

namespace {

// One element's value from its `words` (1, 2 or 4 of them; see random_blocks_needed),
// by the transforms the CUDA kernel uses too.
template <class T>
T draw(const uint32_t* w, RandomKind kind, double a, double b) {
  switch (kind) {
    case RandomKind::Uniform: return random_uniform<T>(w, a, b);
    case RandomKind::Normal: return random_normal<T>(w, a, b);
    case RandomKind::Integer: break;
  }
  return random_integer<T>(w, a, b);
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

void cpu::register_random_kernels() {
  random_stub.set(DeviceType::CPU, &random_kernel);
}

}  // namespace weft
