// Device-side error records, the GPU's half (Note [Device-side errors] in
// device_error_record.h): the sink a kernel reports into, and the host's check at its
// synchronisation points (CUDA-only header).
//
// One record per physical GPU, shared by the logical devices on it: a claim word in
// device memory, which the first reporting thread takes with atomicCAS (so one record is
// written whole, whatever the number of threads that find an error at once), and the
// record itself in mapped page-locked host memory, which the kernel writes directly and
// the host reads after a synchronisation with no copy: checking costs a memory read, so
// every synchronisation can afford it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/device.h"
#include "kernels/cuda/device_error_record.h"

namespace weft::cuda {

// Where a kernel reports bad input; a kernel argument (trivially copyable).
struct DeviceErrorSink {
  unsigned int* claim = nullptr;        // device memory: 0 until a thread takes the record
  DeviceErrorRecord* record = nullptr;  // its device address (mapped page-locked memory)
  int32_t device_index = 0;             // the logical device the op runs on
};

#ifdef __CUDACC__
// Records the error unless one is pending already (the first one wins). `op` must be a
// string literal: the host prints it from this address.
__device__ inline void report_device_error(const DeviceErrorSink& sink, DeviceErrorKind kind, const char* op,
                                           int64_t value, int64_t position, int64_t bound, int64_t ignore_index = 0) {
  if (atomicCAS(sink.claim, 0u, 1u) != 0u) return;
  volatile DeviceErrorRecord* r = sink.record;
  r->device_index = sink.device_index;
  r->op = op;
  r->value = value;
  r->position = position;
  r->bound = bound;
  r->ignore_index = ignore_index;
  __threadfence_system();  // the fields reach the host before the kind that publishes them
  r->kind = static_cast<int32_t>(kind);
}
#endif

// The sink of `device`'s GPU, created on first use (the caller holds a DeviceGuard).
DeviceErrorSink device_error_sink(Device device);

// After a synchronisation: if a kernel on any GPU of this process recorded an error,
// clears the record (the GPU stays usable) and throws weft::Error with its description.
// A kernel that has not finished is not waited for: its error is raised at a later
// synchronisation.
void raise_pending_device_error();

}  // namespace weft::cuda
