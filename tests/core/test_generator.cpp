// Generator: Philox known answers, reproducibility, the word -> value transforms and
// the word layout that the CPU and CUDA kernels share, distributions.
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/random_kernels.h"
#include "kernels/random_transforms.h"

using namespace weft;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  // Counter and key all zero.
  CHECK(philox4x32(0, 0, 0) == std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  // Counter and key all ones.
  CHECK(philox4x32(~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}) ==
        std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  // Digits of pi: counter (243f6a88, 85a308d3, 13198a2e, 03707344), key (a4093822, 299f31d0).
  CHECK(philox4x32(0x299f31d0a4093822, 0x85a308d3243f6a88, 0x0370734413198a2e) ==
        std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("same seed, same numbers; generators advance") {
  Generator g1(42), g2(42), g3(43);
  Tensor a = rand({1000}, DType::Float32, &g1);
  Tensor b = rand({1000}, DType::Float32, &g2);
  Tensor c = rand({1000}, DType::Float32, &g3);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != c.to_vector<float>());
  Tensor next = rand({1000}, DType::Float32, &g1);
  CHECK(next.to_vector<float>() != a.to_vector<float>());
  g1.manual_seed(42);
  CHECK(rand({1000}, DType::Float32, &g1).to_vector<float>() == a.to_vector<float>());

  manual_seed(7);
  auto first = randn({10}).to_vector<float>();
  manual_seed(7);
  CHECK(randn({10}).to_vector<float>() == first);
}

TEST_CASE("element i depends on (seed, offset, i) only") {
  // A prefix of a longer draw equals a shorter draw: values do not depend on numel or on
  // how the work was split across threads.
  Generator g1(9), g2(9);
  auto longer = randn({100000}, DType::Float64, &g1).to_vector<double>();
  auto shorter = randn({10}, DType::Float64, &g2).to_vector<double>();
  CHECK(std::equal(shorter.begin(), shorter.end(), longer.begin()));
}

TEST_CASE("random transforms: the bits each one uses, its end points, the Box-Muller branch") {
  const uint32_t zero[4] = {0, 0, 0, 0}, ones[4] = {~0u, ~0u, ~0u, ~0u};
  // float32 uniforms use the top 24 bits of one word, float64 ones 53 bits of two.
  CHECK(random_uniform<float>(zero, 0, 1) == 0.0f);
  CHECK(random_uniform<float>(ones, 0, 1) == 0x1.fffffep-1f);  // 1 - 2^-24: 1 is never drawn
  const uint32_t low_byte[1] = {0xFF}, bit_8[1] = {0x100};
  CHECK(random_uniform<float>(low_byte, 0, 1) == 0.0f);
  CHECK(random_uniform<float>(bit_8, 0, 1) == 0x1p-24f);
  CHECK(random_uniform<double>(ones, 0, 1) == 1 - 0x1p-53);
  const uint32_t lo_7ff[2] = {0, 0x7FF}, lo_800[2] = {0, 0x800}, hi_1[2] = {1, 0};
  CHECK(random_uniform<double>(lo_7ff, 0, 1) == 0.0);
  CHECK(random_uniform<double>(lo_800, 0, 1) == 0x1p-53);
  CHECK(random_uniform<double>(hi_1, 0, 1) == 0x1p-32);  // the first word holds the high bits
  CHECK(random_uniform<double>(zero, -3, 5) == -3.0);

  // Normals: the first uniform sets the radius, the second the angle. u1 = 1 gives
  // radius 0, so exactly the mean; u1 = 2^-32 (2^-53) gives sqrt(-2 log u1), times
  // cos(2 pi u2): +1 for u2 = 1, -1 for u2 = 1/2.
  const uint32_t radius_0[2] = {~0u, 0x1234};
  CHECK(random_normal<float>(radius_0, 3, 2) == 3.0f);
  const uint32_t half_turn[2] = {0, 0x7FFFFFFF};
  CHECK(random_normal<float>(half_turn, 0, 1) == doctest::Approx(-std::sqrt(64 * std::log(2.0))).epsilon(1e-6));
  const uint32_t full_turn[4] = {0, 0, ~0u, ~0u};
  CHECK(random_normal<double>(full_turn, 0, 1) == doctest::Approx(std::sqrt(106 * std::log(2.0))).epsilon(1e-12));

  // Integers: 64 bits (first word high) modulo the range.
  CHECK(random_integer<int64_t>(zero, -5, 17) == -5);
  CHECK(random_integer<int64_t>(ones, -5, 17) == -5 + 15);  // (2^64 - 1) % 22 == 15
  CHECK(random_integer<int64_t>(hi_1, 0, 10) == 6);         // 2^32 % 10
  CHECK(random_integer<int32_t>(lo_800, 0, 10) == 8);       // 2048 % 10
}

TEST_CASE("CPU random fills are the shared transforms over the documented word layout") {
  // Element i of a fill reads words [i*w, i*w + w) of the Philox stream, four words per
  // block; the CUDA kernel computes the same functions of the same words.
  const uint64_t seed = 0xC0FFEE;
  auto block = [&](uint64_t k) { return philox4x32(seed, k); };
  Generator g(seed);
  auto u32 = rand({6}, DType::Float32, &g).to_vector<float>();  // w = 1
  for (int i = 0; i < 6; ++i) CHECK(u32[i] == random_uniform<float>(block(i / 4).data() + i % 4, 0, 1));
  g.manual_seed(seed);
  auto u64 = rand({3}, DType::Float64, &g).to_vector<double>();  // w = 2
  for (int i = 0; i < 3; ++i) CHECK(u64[i] == random_uniform<double>(block(i / 2).data() + 2 * (i % 2), 0, 1));
  g.manual_seed(seed);
  auto n64 = randn({2}, DType::Float64, &g).to_vector<double>();  // w = 4
  for (int i = 0; i < 2; ++i) CHECK(n64[i] == random_normal<double>(block(i).data(), 0, 1));
  g.manual_seed(seed);
  auto ints = randint(-7, 1000, {3}, DType::Int64, &g).to_vector<int64_t>();  // w = 2
  for (int i = 0; i < 3; ++i)
    CHECK(ints[i] == random_integer<int64_t>(block(i / 2).data() + 2 * (i % 2), -7, 1000));
}

// The GPU's float64 uniform (kernels/cuda/random.cu, through kernels/random_transforms.h),
// written out as nvcc compiles it: 53 bits of words (w0, w1) to a unit in [0, 1), then
// a + (b - a) * unit with one rounding (random_uniform's hd::mul_add is a fused multiply-add
// on the device).
double gpu_uniform64(uint32_t w0, uint32_t w1, double a, double b) {
  const uint64_t k = (uint64_t{w0} << 21) ^ (w1 >> 11);
  const double unit = (static_cast<double>(k) + 1.0) * 0x1p-53 - 0x1p-53;  // exact: k * 2^-53
  return std::fma(b - a, unit, a);
}

// CPU/GPU parity of uniform draws: with bounds other than (0, 1) the last step is a
// multiply-add, and its rounding is what could differ (Note [Fused multiply-add in shared
// formulas]; kernels/cpu/random.cpp is compiled with -ffp-contract=off, so only the
// explicit fused step is fused). This test is compiled for the library's CPU
// (tests/CMakeLists.txt), so __FMA__ says whether the CPU kernel fuses too.
TEST_CASE("float64 uniform draws with bounds other than (0, 1) equal the GPU's formula bit for bit") {
  const uint64_t seed = 0xBADC0FFEE, first_block = 77;
  const int64_t n = 4001;
  const double bounds[][2] = {{-2.5, 7.25}, {1e-3, 1e3}, {-1e10, 3.0}, {0.1, 0.3}, {-1.0, -0x1p-30}};
  // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
  for (const auto& bound : bounds) {
    const double a = bound[0], b = bound[1];
    CAPTURE(a);
    CAPTURE(b);
    Tensor cpu = empty({n}, DType::Float64);
    random_stub(kCPU, cpu, RandomKind::Uniform, a, b, seed, first_block);
    const auto values = cpu.to_vector<double>();
    int64_t mismatches = 0, rounding_matters = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto words = philox4x32(seed, first_block + static_cast<uint64_t>(i / 2));
      const uint32_t w0 = words[2 * (i % 2)], w1 = words[2 * (i % 2) + 1];
      const double fused = gpu_uniform64(w0, w1, a, b);
      const double k_unit = static_cast<double>((uint64_t{w0} << 21) ^ (w1 >> 11)) * 0x1p-53;
      volatile double product = (b - a) * k_unit;  // volatile: rounded on its own, never fused
      const double unfused = product + a;
      rounding_matters += fused != unfused;
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
      mismatches += std::memcmp(&values[i], &fused, sizeof(double)) != 0;
#else
      // A CPU without FMA instructions rounds twice (Note [Fused multiply-add in shared formulas]).
      mismatches += std::memcmp(&values[i], &unfused, sizeof(double)) != 0;
#endif
    }
    CHECK(mismatches == 0);
    // The bounds are chosen so that one rounding or two gives different draws: the check
    // above would catch a CPU kernel that contracted differently from the GPU.
    if (b - a != 1.0) CHECK(rounding_matters > 0);
  }
}

TEST_CASE("distributions") {
  Generator g(1);
  auto u = rand({200000}, DType::Float64, &g).to_vector<double>();
  CHECK(*std::min_element(u.begin(), u.end()) >= 0.0);
  CHECK(*std::max_element(u.begin(), u.end()) < 1.0);
  CHECK(std::accumulate(u.begin(), u.end(), 0.0) / u.size() == doctest::Approx(0.5).epsilon(0.01));

  auto n = randn({200000}, DType::Float32, &g).to_vector<float>();
  double mean = std::accumulate(n.begin(), n.end(), 0.0) / n.size();
  double sq = 0;
  for (float v : n) sq += (v - mean) * (v - mean);
  CHECK(std::abs(mean) < 0.01);
  CHECK(std::sqrt(sq / n.size()) == doctest::Approx(1.0).epsilon(0.01));

  auto ints = randint(-3, 4, {10000}, DType::Int64, &g).to_vector<int64_t>();
  CHECK(*std::min_element(ints.begin(), ints.end()) == -3);
  CHECK(*std::max_element(ints.begin(), ints.end()) == 3);

  auto perm = randperm(50, DType::Int64, &g).to_vector<int64_t>();
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected(50);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(sorted == expected);
  CHECK(perm != expected);

  CHECK_THROWS_WITH_AS(randint(3, 3, {2}), doctest::Contains("low (3) must be less than high (3)"), Error);
  CHECK_THROWS_WITH_AS(rand({2}, DType::Int64), doctest::Contains("expected a floating dtype"), Error);
}
