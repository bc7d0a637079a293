// The backend and device a multi-process test worker runs on: WEFT_TEST_BACKEND=nccl puts
// its tensors on cuda:LOCAL_RANK (modulo the devices) behind the nccl backend; the default
// is gloo on the CPU.
#pragma once

#include <cstdlib>
#include <string>

#include <weft.h>

namespace weft::test {

inline std::string worker_backend() {
  const char* b = std::getenv("WEFT_TEST_BACKEND");
  return b && *b ? b : "gloo";
}

inline Device worker_device() {
  if (worker_backend() != "nccl") return kCPU;
  const char* local = std::getenv("LOCAL_RANK");
  return Device::cuda((local ? std::atoi(local) : 0) % cuda_device_count());
}

}  // namespace weft::test
