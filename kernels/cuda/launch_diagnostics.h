// What a failed kernel launch reports, and the WEFT_CUDA_SYNC_LAUNCHES switch.
//
// Plain C++ (no CUDA header), so that it is tested on machines without a GPU;
// kernels/cuda/launch_check.cpp applies it after every launch.
//
// Why a launch check names its op: cudaGetLastError right after <<<...>>> catches a bad
// launch configuration at the launch that made it, but a fault inside a kernel (an illegal
// address, a misaligned access) surfaces later, at whatever call next waits for the GPU,
// and it is sticky: every CUDA call after it fails too. Without the op's name a failure
// says only "kernel launch" and a line that many ops share. With WEFT_CUDA_SYNC_LAUNCHES=1
// every launch is followed by a synchronisation of its stream, so a fault is reported at
// the op that caused it, by name (CUDA_LAUNCH_BLOCKING=1 serialises launches the same way,
// but its error names no op). It is a debugging mode: each launch then costs a round trip.
#pragma once

#include <string>

namespace weft::cuda {

// The value of WEFT_CUDA_SYNC_LAUNCHES: nullptr (unset), "" or "0" is off, "1" is on;
// anything else throws weft::Error naming the variable and the values it accepts.
bool parse_sync_launches(const char* value);

// The message of a failed check of `op`'s kernel launch (op "" when the launch named no
// op: the teaching ladders of kernels/dev/). error_name / error_text: CUDA's name and
// description of the status. `after_sync`: the status came from the synchronisation that
// WEFT_CUDA_SYNC_LAUNCHES adds (the kernel ran and faulted), not from the launch itself.
// `sync_launches`: whether that mode is on (when it is off, the message says how to find
// the op behind an earlier kernel's fault that surfaced here).
std::string launch_failure_message(const std::string& op, const char* error_name, const char* error_text,
                                   const char* file, int line, bool after_sync, bool sync_launches);

}  // namespace weft::cuda
