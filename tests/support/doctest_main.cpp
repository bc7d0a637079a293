// The doctest main shared by every suite. Built a second time with WEFT_TEST_NEEDS_CUDA
// for the test_cuda_* suites: without a usable GPU they print why and exit 77, which
// CTest reports as skipped (SKIP_RETURN_CODE), so a CPU-only run shows them as skipped
// rather than silently passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#ifdef WEFT_TEST_NEEDS_CUDA
#include <iostream>

#include "core/device.h"
#endif

int main(int argc, char** argv) {
#ifdef WEFT_TEST_NEEDS_CUDA
  if (!weft::cuda_available()) {
    std::cout << "skipped: this suite needs a CUDA GPU (" << weft::cuda_unavailable_reason() << ")\n";
    return 77;
  }
#endif
  doctest::Context context(argc, argv);
  return context.run();
}
