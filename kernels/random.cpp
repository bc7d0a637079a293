// The random factories: a range of Philox counters from a generator, values from the kernel.
#include "kernels/random.h"

#include <algorithm>

#include "kernels/random_kernels.h"

namespace weft {

constinit DispatchStub<RandomFn> random_stub{"random"};

int64_t random_words_per_element(DType dtype, RandomKind kind) {
  // One word for a float32 uniform; two for a float64 uniform, a float32 normal (two
  // uniforms) or an integer (64 bits); four for a float64 normal.
  if (kind == RandomKind::Uniform && dtype != DType::Float64) return 1;
  if (kind == RandomKind::Normal && dtype == DType::Float64) return 4;
  return 2;
}

uint64_t random_blocks_needed(int64_t numel, DType dtype, RandomKind kind) {
  return (static_cast<uint64_t>(numel) * random_words_per_element(dtype, kind) + 3) / 4;
}

namespace {

Tensor random_tensor(const Shape& shape, const TensorOptions& options, RandomKind kind, double a, double b,
                     Generator* gen) {
  Tensor t = empty(shape, options.with_requires_grad(false));
  if (t.numel() > 0) {
    Generator& g = gen ? *gen : default_generator(t.device());
    auto [seed, first] = g.reserve(random_blocks_needed(t.numel(), t.dtype(), kind));
    random_stub(t.device(), t, kind, a, b, seed, first);
  }
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* gen) {
  WEFT_CHECK(is_floating(options.dtype), "rand: expected a floating dtype, got ", options.dtype);
  return random_tensor(shape, options, RandomKind::Uniform, 0.0, 1.0, gen);
}

Tensor randn(const Shape& shape, const TensorOptions& options, Generator* gen) {
  WEFT_CHECK(is_floating(options.dtype), "randn: expected a floating dtype, got ", options.dtype);
  return random_tensor(shape, options, RandomKind::Normal, 0.0, 1.0, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options, Generator* gen) {
  WEFT_CHECK(low < high, "randint: low (", low, ") must be less than high (", high, ")");
  return random_tensor(shape, options, RandomKind::Integer, static_cast<double>(low), static_cast<double>(high), gen);
}

Tensor randperm(int64_t n, const TensorOptions& options, Generator* gen) {
  WEFT_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  // Fisher-Yates on the host: position i swaps with a draw from [0, i]. Each draw uses
  // the 64-bit integer words of one element of a random stream, so the permutation
  // depends only on (seed, offset, n).
  // The draws are made on the host, from the generator of the device asked for.
  Generator& g = gen ? *gen : default_generator(options.device);
  Tensor draws = random_tensor({n}, TensorOptions(DType::Int64), RandomKind::Integer, 0.0, 9.0e15, &g);
  const int64_t* r = draws.data_ptr<int64_t>();
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[r[i] % (i + 1)]);
  return tensor(perm, Shape{n}, options);
}

Tensor rand_like(const Tensor& t, Generator* gen) { return rand(t.shape(), TensorOptions(t.dtype(), t.device()), gen); }
Tensor randn_like(const Tensor& t, Generator* gen) {
  return randn(t.shape(), TensorOptions(t.dtype(), t.device()), gen);
}

}  // namespace weft
