// The record a CUDA kernel leaves when it finds bad input, and the message the host makes
// of it. Plain C++ (no CUDA header), so that the messages are tested on every machine;
// kernels/cuda/device_error.h has the GPU's side.
//
// Note [Device-side errors]: some checks can only be answered on the GPU: is every index
// of a gather in range, is every class target of a loss in [0, C)? If the host waited for
// each answer, every such op would cost a host synchronisation, several per training step,
// and the host could no longer run ahead of the GPU. So, as PyTorch's device asserts do,
// the kernel records what it found and the op goes on (its kernels skip the bad entries,
// never dereference them: a gather reads 0 there), and the host raises a weft::Error at
// its next synchronisation with the GPU: a stream, event or device synchronize, item(), a
// copy to the host. Unlike a device assert, this leaves the GPU usable: the record is
// cleared when it is raised and later ops run normally. The first error is kept until it
// is raised; later ones are dropped. WEFT_CUDA_SYNC_LAUNCHES=1 raises it at the launch of
// the op that recorded it. CPU ops keep checking before they run (same ops, immediate
// errors, and messages that give the position as a multi-index).
#pragma once

#include <cstdint>
#include <string>

namespace weft::cuda {

enum class DeviceErrorKind : int32_t {
  None = 0,
  IndexOutOfRange = 1,   // value: the index; bound: the size it indexes
  TargetOutOfRange = 2,  // value: the class target; bound: the number of classes; ignore_index
};

// Written by one kernel thread into page-locked memory that the host reads after a
// synchronisation; `kind` is written last, so a record whose kind is set is complete.
struct DeviceErrorRecord {
  int32_t kind = 0;          // a DeviceErrorKind
  int32_t device_index = 0;  // the logical CUDA device the op ran on
  const char* op = nullptr;  // a string literal naming the op (its host address: the GPU only copies it)
  int64_t value = 0;
  int64_t position = 0;      // flat (row-major) position in the index or target tensor
  int64_t bound = 0;
  int64_t ignore_index = 0;
};

// "gather: index 7 at flat position 3 is out of range (expected 0 <= index < 4); found on
// cuda:0 by the op's kernel, reported at the next synchronisation ...". A record of an
// unknown kind still gives its op and numbers.
std::string describe_device_error(const DeviceErrorRecord& record);

}  // namespace weft::cuda
