// Generator: Philox known answers, reproducibility, distributions.
#include "test_util.h"

#include <algorithm>
#include <numeric>

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
