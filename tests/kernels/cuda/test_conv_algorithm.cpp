// The rules that choose a cuDNN convolution algorithm (kernels/cuda/conv_algorithm.h), on
// made-up candidate lists, and the deterministic-algorithms switch that selects them
// (core/determinism.h): runs on every machine.
#include <doctest/doctest.h>

#include <cstdlib>

#include "core/determinism.h"
#include "core/error.h"
#include "kernels/cuda/conv_algorithm.h"

using weft::cuda::choose_conv_algorithm;
using weft::cuda::ConvAlgorithmCandidate;
using weft::cuda::ConvAlgorithmRules;
using weft::cuda::ConvAlgorithmSource;
using weft::cuda::ConvMath;

namespace {

constexpr size_t GiB = size_t{1} << 30;

ConvAlgorithmCandidate algo(int id, bool deterministic, float time_ms = -1.0f, ConvMath math = ConvMath::Fma,
                            size_t workspace = 0, bool succeeded = true) {
  return {id, succeeded, deterministic, math, time_ms, workspace};
}

const ConvAlgorithmRules kTimed{false, true, GiB};          // float32, no TF32
const ConvAlgorithmRules kDeterministic{true, true, GiB};

}  // namespace

TEST_CASE("timed: the fastest acceptable deterministic algorithm, whatever order cuDNN lists them in") {
  const std::vector<ConvAlgorithmCandidate> list = {algo(0, true, 5.0f), algo(1, false, 0.5f), algo(2, true, 1.0f),
                                                    algo(3, true, 3.0f)};
  const auto choice = choose_conv_algorithm(list, kTimed);
  CHECK(choice.source == ConvAlgorithmSource::Cudnn);
  CHECK(choice.algorithm.algo == 2);
  CHECK(choice.algorithm.time_ms == 1.0f);
}

TEST_CASE("deterministic: the first deterministic algorithm in heuristic order, timings ignored") {
  // The same list: cuDNN's heuristic puts 0 first; a timed run would prefer 2.
  const std::vector<ConvAlgorithmCandidate> list = {algo(1, false, 0.5f), algo(0, true, 5.0f), algo(2, true, 1.0f)};
  CHECK(choose_conv_algorithm(list, kDeterministic).algorithm.algo == 0);
  CHECK(choose_conv_algorithm(list, kTimed).algorithm.algo == 2);
  // Heuristic candidates carry no time at all.
  const std::vector<ConvAlgorithmCandidate> heuristic = {algo(6, false), algo(4, true), algo(5, true)};
  const auto choice = choose_conv_algorithm(heuristic, kDeterministic);
  CHECK(choice.source == ConvAlgorithmSource::Cudnn);
  CHECK(choice.algorithm.algo == 4);
}

TEST_CASE("failed statuses, half-precision or TF32 math and oversized workspaces are never chosen") {
  const std::vector<ConvAlgorithmCandidate> list = {
      algo(0, true, 0.1f, ConvMath::Fma, 0, /*succeeded=*/false),
      algo(1, true, 0.2f, ConvMath::TensorOpAllowConversion),
      algo(2, true, 0.3f, ConvMath::TensorOp),
      algo(3, true, 0.4f, ConvMath::Default),
      algo(4, true, 0.5f, ConvMath::Fma, 2 * GiB),
      algo(5, true, 0.6f, ConvMath::Fma, GiB),  // exactly the limit is fine
  };
  for (const ConvAlgorithmRules& rules : {kTimed, kDeterministic}) {
    const auto choice = choose_conv_algorithm(list, rules);
    CHECK(choice.source == ConvAlgorithmSource::Cudnn);
    CHECK(choice.algorithm.algo == 5);
  }
  // With TF32 allowed (or float64), tensor-op and default math are fine; half precision never.
  const ConvAlgorithmRules tf32{false, false, GiB};
  CHECK(choose_conv_algorithm(list, tf32).algorithm.algo == 2);
  const std::vector<ConvAlgorithmCandidate> only_half = {algo(1, true, 0.2f, ConvMath::TensorOpAllowConversion)};
  CHECK(choose_conv_algorithm(only_half, tf32).source == ConvAlgorithmSource::WeftKernel);
}

TEST_CASE("no deterministic algorithm: timed mode downgrades to cuDNN's fastest, deterministic mode to weft's kernel") {
  const std::vector<ConvAlgorithmCandidate> list = {algo(0, false, 2.0f), algo(1, false, 1.0f),
                                                    algo(2, true, 0.5f, ConvMath::TensorOp)};
  const auto timed = choose_conv_algorithm(list, kTimed);
  CHECK(timed.source == ConvAlgorithmSource::CudnnNonDeterministic);
  CHECK(timed.algorithm.algo == 1);
  CHECK(timed.rejected == "of 3 candidates: 1 with TF32 or half-precision math (float32 without allow_tf32 asks "
                          "for FMA), 2 not deterministic");
  const auto deterministic = choose_conv_algorithm(list, kDeterministic);
  CHECK(deterministic.source == ConvAlgorithmSource::WeftKernel);
  CHECK(deterministic.rejected == timed.rejected);
}

TEST_CASE("no acceptable algorithm at all (no FMA one, all failed, none listed): weft's kernel in both modes") {
  const std::vector<ConvAlgorithmCandidate> no_fma = {algo(0, true, 1.0f, ConvMath::TensorOp),
                                                      algo(1, false, 2.0f, ConvMath::Default)};
  const std::vector<ConvAlgorithmCandidate> failed = {algo(0, true, -1.0f, ConvMath::Fma, 0, false),
                                                      algo(1, true, -1.0f, ConvMath::Fma, 0, false)};
  const std::vector<ConvAlgorithmCandidate> too_big = {algo(0, true, 1.0f, ConvMath::Fma, 3 * GiB)};
  for (const ConvAlgorithmRules& rules : {kTimed, kDeterministic}) {
    CHECK(choose_conv_algorithm(no_fma, rules).source == ConvAlgorithmSource::WeftKernel);
    CHECK(choose_conv_algorithm(failed, rules).source == ConvAlgorithmSource::WeftKernel);
    CHECK(choose_conv_algorithm(too_big, rules).source == ConvAlgorithmSource::WeftKernel);
    CHECK(choose_conv_algorithm({}, rules).source == ConvAlgorithmSource::WeftKernel);
  }
  CHECK(choose_conv_algorithm(failed, kTimed).rejected == "of 2 candidates: 2 not supported or failed in cuDNN");
  CHECK(choose_conv_algorithm(too_big, kTimed).rejected == "of 1 candidate: 1 needing more than 1.00 GiB of workspace");
  CHECK(choose_conv_algorithm({}, kTimed).rejected == "of 0 candidates");
}

TEST_CASE("timed mode puts candidates without a time after every timed one") {
  const std::vector<ConvAlgorithmCandidate> list = {algo(0, true, -1.0f), algo(1, true, 4.0f), algo(2, true, 3.0f)};
  CHECK(choose_conv_algorithm(list, kTimed).algorithm.algo == 2);
  // Equal times keep cuDNN's order.
  const std::vector<ConvAlgorithmCandidate> ties = {algo(7, true, 1.0f), algo(3, true, 1.0f)};
  CHECK(choose_conv_algorithm(ties, kTimed).algorithm.algo == 7);
}

TEST_CASE("WEFT_DETERMINISTIC: 1 or 0, unset keeps the default, anything else an error") {
  using weft::deterministic_setting;
  CHECK(deterministic_setting(nullptr, false) == false);
  CHECK(deterministic_setting("", true) == true);
  CHECK(deterministic_setting("1", false) == true);
  CHECK(deterministic_setting("0", true) == false);
  for (const char* bad : {"yes", "true", "2", " 1", "on"}) {
    CAPTURE(bad);
    const std::string expected = "WEFT_DETERMINISTIC='" + std::string(bad) + "': expected 1";
    CHECK_THROWS_WITH_AS(deterministic_setting(bad, false), doctest::Contains(expected.c_str()), weft::Error);
  }
}

TEST_CASE("use_deterministic_algorithms switches the mode for the process") {
  const bool before = weft::deterministic_algorithms();
  weft::use_deterministic_algorithms(true);
  CHECK(weft::deterministic_algorithms());
  weft::use_deterministic_algorithms(false);
  CHECK_FALSE(weft::deterministic_algorithms());
  weft::use_deterministic_algorithms(before);
}
