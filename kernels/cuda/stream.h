// The CUDA side of core's streams and events (core/stream.h).
//
// Every logical device has one compute stream (its default stream, non-blocking, created
// on first use) and one upload stream for host-to-device copies that overlap compute
// (DevicePrefetcher); communication gets streams of its own from new_stream(). Work on
// different streams is ordered with events, never with host synchronisation (docs/design.md,
// "Streams and memory"). Streams live as long as the process, as in PyTorch.
//
// Code outside kernels/cuda uses weft::Stream and weft::Event; CudaBackend
// (kernels/cuda/backend.cpp) forwards their operations to the functions below, and CUDA
// code turns a weft::Stream into its cudaStream_t with native().
#pragma once

#include <cuda_runtime_api.h>

#include "core/stream.h"

namespace weft::cuda {

inline cudaStream_t native(const Stream& stream) { return static_cast<cudaStream_t>(stream.handle()); }
// The stream ops on `device` launch on: this thread's current stream of the device.
inline cudaStream_t current_native_stream(Device device) { return native(current_stream(device)); }

cudaStream_t compute_stream_handle(Device device);
cudaStream_t upload_stream_handle(Device device);
cudaStream_t new_stream_handle(Device device);
void synchronize_stream(Device device, cudaStream_t stream);
bool query_stream(cudaStream_t stream);

// Events: created on `device` (timing on request), recorded, waited for, timed.
cudaEvent_t create_event(Device device, bool timing);
void destroy_event(cudaEvent_t event) noexcept;
void record_event(cudaEvent_t event, Device device, cudaStream_t stream);
void block_on_event(cudaEvent_t event, Device device, cudaStream_t stream);
bool query_event(cudaEvent_t event);
void synchronize_event(cudaEvent_t event);
float elapsed_ms(cudaEvent_t start, cudaEvent_t end);

}  // namespace weft::cuda
