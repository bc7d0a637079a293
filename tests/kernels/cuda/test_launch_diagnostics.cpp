// What the CUDA backend says when a kernel launch fails or a kernel records bad input, and
// the WEFT_CUDA_SYNC_LAUNCHES switch: plain C++ (kernels/cuda/launch_diagnostics.h,
// device_error_record.h), so tested on every machine; test_cuda_device_errors runs the
// same paths on a GPU.
#include <doctest/doctest.h>

#include <weft.h>

#include <limits>
#include <string>

#include "kernels/cuda/device_error_record.h"
#include "kernels/cuda/launch_diagnostics.h"

using namespace weft;
using namespace weft::cuda;

TEST_CASE("WEFT_CUDA_SYNC_LAUNCHES: unset, empty and 0 are off, 1 is on, anything else is an error") {
  CHECK_FALSE(parse_sync_launches(nullptr));
  CHECK_FALSE(parse_sync_launches(""));
  CHECK_FALSE(parse_sync_launches("0"));
  CHECK(parse_sync_launches("1"));
  for (const char* bad : {"yes", "true", "2", " 1", "1 ", "01", "-1", "on"}) {
    CAPTURE(bad);
    const std::string expected = std::string("WEFT_CUDA_SYNC_LAUNCHES='") + bad + "': expected 1";
    CHECK_THROWS_WITH_AS(parse_sync_launches(bad), doctest::Contains(expected.c_str()), Error);
  }
}

TEST_CASE("a launch failure names the op, CUDA's error, the file and line") {
  const std::string at_launch =
      launch_failure_message("max_pool2d_backward", "cudaErrorInvalidConfiguration", "invalid configuration argument",
                             "kernels/cuda/pooling_kernels.cu", 171, false, false);
  CHECK(at_launch.find("CUDA error cudaErrorInvalidConfiguration (invalid configuration argument) launching the "
                       "kernel of max_pool2d_backward at kernels/cuda/pooling_kernels.cu:171") == 0);
  // Without the sync mode, an earlier kernel's sticky fault may be what surfaced here.
  CHECK(at_launch.find("rerun with WEFT_CUDA_SYNC_LAUNCHES=1") != std::string::npos);

  const std::string after_sync = launch_failure_message("gather", "cudaErrorIllegalAddress",
                                                        "an illegal memory access was encountered",
                                                        "kernels/cuda/index_ops.cu", 300, true, true);
  CHECK(after_sync ==
        "CUDA error cudaErrorIllegalAddress (an illegal memory access was encountered) in the kernel of gather, found "
        "by the synchronisation after its launch (WEFT_CUDA_SYNC_LAUNCHES=1) at kernels/cuda/index_ops.cu:300");

  // The teaching ladders launch without naming an op.
  const std::string unnamed = launch_failure_message("", "cudaErrorLaunchOutOfResources", "too many resources",
                                                     "kernels/dev/sgemm.cu", 247, false, true);
  CHECK(unnamed.find("launching a kernel at kernels/dev/sgemm.cu:247") != std::string::npos);
  CHECK(unnamed.find("rerun with") == std::string::npos);
}

TEST_CASE("device-side error records: index and target messages name the op, the value and the bound") {
  DeviceErrorRecord index;
  index.kind = static_cast<int32_t>(DeviceErrorKind::IndexOutOfRange);
  index.device_index = 2;
  index.op = "gather";
  index.value = 7;
  index.position = 3;
  index.bound = 4;
  const std::string index_message = describe_device_error(index);
  CHECK(index_message.find("gather: index 7 at flat position 3 is out of range (expected 0 <= index < 4); found on "
                           "cuda:2 by the op's kernel") == 0);
  CHECK(index_message.find("WEFT_CUDA_SYNC_LAUNCHES=1") != std::string::npos);

  DeviceErrorRecord target;
  target.kind = static_cast<int32_t>(DeviceErrorKind::TargetOutOfRange);
  target.op = "cross_entropy";
  target.value = -5;
  target.position = 12;
  target.bound = 10;
  target.ignore_index = -100;
  // The CPU's message, with the position flat (the kernel does not know the target's shape).
  CHECK(describe_device_error(target).find("cross_entropy: target value -5 at flat position 12 is out of range for 10 "
                                           "classes (expected 0 .. 9, or ignore_index -100); found on cuda:0") == 0);

  DeviceErrorRecord odd;
  odd.kind = 99;
  odd.value = std::numeric_limits<int64_t>::min();
  CHECK(describe_device_error(odd).find("a CUDA op: device-side error of kind 99 (value -9223372036854775808") == 0);
}
