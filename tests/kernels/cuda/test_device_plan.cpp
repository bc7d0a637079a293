// Logical CUDA devices on physical GPUs (WEFT_VIRTUAL_DEVICES): the plan is pure, so it
// is tested on every machine; test_cuda_runtime runs it on a GPU.
#include <doctest/doctest.h>

#include <weft.h>

#include "kernels/cuda/device_plan.h"

using weft::cuda::plan_logical_devices;

TEST_CASE("one logical device per GPU by default") {
  CHECK(plan_logical_devices(2, nullptr) == std::vector<int>{0, 1});
  CHECK(plan_logical_devices(2, "") == std::vector<int>{0, 1});
  CHECK(plan_logical_devices(0, nullptr).empty());
}

TEST_CASE("WEFT_VIRTUAL_DEVICES maps logical devices round-robin onto the GPUs") {
  CHECK(plan_logical_devices(1, "4") == std::vector<int>{0, 0, 0, 0});
  CHECK(plan_logical_devices(2, "5") == std::vector<int>{0, 1, 0, 1, 0});
  CHECK(plan_logical_devices(4, "2") == std::vector<int>{0, 1});
  CHECK(plan_logical_devices(0, "4").empty());  // no GPU: nothing to map onto
}

TEST_CASE("a malformed WEFT_VIRTUAL_DEVICES is a clear error") {
  for (const char* bad : {"0", "-1", "two", "3x", "65", " 2"})
    CHECK_THROWS_WITH_AS(plan_logical_devices(1, bad), doctest::Contains("WEFT_VIRTUAL_DEVICES='"), weft::Error);
  CHECK_THROWS_WITH_AS(plan_logical_devices(1, "0"), doctest::Contains("from 1 to 64"), weft::Error);
}

TEST_CASE("without a usable GPU, asking for a CUDA tensor names the reason") {
  if (weft::cuda_available()) return;  // covered by test_cuda_runtime on a GPU machine
  CHECK_FALSE(weft::cuda_unavailable_reason().empty());
  CHECK_THROWS_WITH_AS(weft::zeros({2}, weft::TensorOptions(weft::DType::Float32, weft::Device::cuda(0))),
                       doctest::Contains("cannot use device cuda:0: "), weft::Error);
  CHECK_THROWS_WITH_AS(weft::ones({2}).pin_memory(), doctest::Contains("pin_memory: page-locked memory needs"),
                       weft::Error);
  CHECK_FALSE(weft::ones({2}).is_pinned());
}
