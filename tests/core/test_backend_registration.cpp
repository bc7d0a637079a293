// Every DispatchStub has a CPU kernel, and gets a CUDA kernel from the CUDA backend.
//
// Stubs list themselves when a backend fills them (core/dispatch.h), so these loops cover
// every stub, not a hand-written list. The CUDA registration only fills tables (no CUDA
// call), so its half runs without a GPU and catches a missing stub that would otherwise show
// only on a GPU ("the CUDA backend has no kernel for this op"). Every program registers
// every CPU kernel file at start-up (kernels/register_kernels.cpp), so every stub that has
// a CPU kernel is in the list; in a build without CUDA, CTest shows the CUDA half as the
// skipped entry test_backend_registration_cuda.
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include <weft.h>

#include "core/copy.h"
#include "core/dispatch.h"

#ifdef WEFT_WITH_CUDA
#include "kernels/cuda/backend.h"
#endif

using namespace weft;

TEST_CASE("every DispatchStub has a CPU kernel") {
  auto stubs = all_dispatch_stubs();
  CHECK(stubs.size() >= 37);  // 37 today: a shorter list means a kernel file is not registered
  for (const DispatchStubBase* stub : stubs) CHECK_MESSAGE(stub->has(DeviceType::CPU), stub->name(), " has no CPU kernel");
}

TEST_CASE("a missing kernel says why") {
  // Built without CUDA, or without a GPU, the error names the op, the device and the reason.
  if (cuda_available()) return;
  Tensor t = ones({2});
  CHECK_THROWS_WITH_AS(t.to(Device::cuda()), doctest::Contains("cannot use device cuda:0: "), Error);
  CHECK_THROWS_WITH_AS(copy_stub(Device::cuda(1), t, t), doctest::Contains("copy_ on cuda:1: "), Error);
  CHECK_THROWS_WITH_AS(copy_stub(Device::cuda(1), t, t), doctest::Contains(cuda_unavailable_reason().c_str()), Error);
}

#ifdef WEFT_WITH_CUDA
TEST_CASE("every DispatchStub gets a CUDA kernel from the backend") {
  cuda::register_kernels();
  for (const DispatchStubBase* stub : all_dispatch_stubs())
    CHECK_MESSAGE(stub->has(DeviceType::CUDA), stub->name(), " has no CUDA kernel");
}
#endif
