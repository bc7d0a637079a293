// CUDA random fills: the Philox words of core/generator.h turned into values by the
// transforms of kernels/random_transforms.h, which the CPU kernel calls too, so one
// generator state gives one tensor on either device.
//
// Element i of a fill uses words [i*w, i*w + w) of the Philox stream (w = 1, 2 or 4, per
// dtype and kind), so Philox block k makes elements [k*4/w, (k+1)*4/w). One thread per
// block computes the block once and writes its 4/w consecutive elements, as one aligned
// packet store when it can. Integers and uniforms equal the CPU's bit for bit; normals
// may differ by an ulp (see kernels/random_transforms.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/generator.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/random_kernels.h"
#include "kernels/random_transforms.h"

namespace weft::cuda {

namespace {

// random_words_per_element (kernels/random.cpp) as a constant of the kernel's types.
template <class T, RandomKind K>
constexpr int kWords = (K == RandomKind::Uniform && !std::is_same_v<T, double>) ? 1
                       : (K == RandomKind::Normal && std::is_same_v<T, double>) ? 4
                                                                                 : 2;

// One element's value from its words, by the transforms the CPU uses too.
template <class T, RandomKind K>
__device__ __forceinline__ T draw(const uint32_t* w, double a, double b) {
  if constexpr (K == RandomKind::Uniform) return random_uniform<T>(w, a, b);
  else if constexpr (K == RandomKind::Normal) return random_normal<T>(w, a, b);
  else return random_integer<T>(w, a, b);
}

// The elements of one Philox block, stored together.
template <class T, int E>
struct alignas(sizeof(T) * E) BlockValues {
  T value[E];
};

template <class T, RandomKind K>
__global__ void random_kernel(T* out, int64_t n, int64_t blocks, double a, double b, uint64_t seed, uint64_t first,
                              bool packed) {
  constexpr int kW = kWords<T, K>;
  constexpr int kE = 4 / kW;  // elements per block
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < blocks; k += step) {
    const auto words = philox4x32(seed, first + static_cast<uint64_t>(k));
    const int64_t i0 = k * kE;
    if (packed && i0 + kE <= n) {
      BlockValues<T, kE> v;
#pragma unroll
      for (int j = 0; j < kE; ++j) v.value[j] = draw<T, K>(words.data() + j * kW, a, b);
      reinterpret_cast<BlockValues<T, kE>*>(out)[k] = v;
    } else {
#pragma unroll
      for (int j = 0; j < kE; ++j)
        if (i0 + j < n) out[i0 + j] = draw<T, K>(words.data() + j * kW, a, b);
    }
  }
}

template <class T, RandomKind K>
void fill(const Tensor& dst, double a, double b, uint64_t seed, uint64_t first_block) {
  constexpr int kW = kWords<T, K>;
  constexpr int kE = 4 / kW;
  WEFT_CHECK(kW == random_words_per_element(dst.dtype(), K),
             "random fill: the CUDA kernel's word layout disagrees with core's for dtype ", dst.dtype());
  const int64_t n = dst.numel();
  const auto blocks = static_cast<int64_t>(random_blocks_needed(n, dst.dtype(), K));
  T* out = dst.data_ptr<T>();
  const bool packed = reinterpret_cast<uintptr_t>(out) % (sizeof(T) * kE) == 0;
  cudaStream_t stream = stream_of(dst.device());
  random_kernel<T, K><<<grid_size(blocks), kBlockSize, 0, stream>>>(out, n, blocks, a, b, seed, first_block, packed);
  WEFT_CUDA_CHECK_LAUNCH(K == RandomKind::Uniform  ? "rand (uniform fill)"
                         : K == RandomKind::Normal ? "randn (normal fill)"
                                                   : "randint (integer fill)",
                         stream);
}

template <class T>
void fill_typed(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t first_block) {
  switch (kind) {
    case RandomKind::Uniform: return fill<T, RandomKind::Uniform>(dst, a, b, seed, first_block);
    case RandomKind::Normal: return fill<T, RandomKind::Normal>(dst, a, b, seed, first_block);
    case RandomKind::Integer: return fill<T, RandomKind::Integer>(dst, a, b, seed, first_block);
  }
}

void random_cuda(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t first_block) {
  WEFT_CHECK(dst.is_contiguous(), "random fill: destination must be contiguous");
  if (dst.numel() == 0) return;
  DeviceGuard guard(dst.device());
  dispatch_dtype(dst.dtype(), DTypeSet::Numeric, "random fill", [&](auto tag) {
    fill_typed<typename decltype(tag)::type>(dst, kind, a, b, seed, first_block);
  });
}

}  // namespace

void register_random_kernels() { random_stub.set(DeviceType::CUDA, &random_cuda); }

}  // namespace weft::cuda
