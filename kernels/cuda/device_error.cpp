// Device-side error records: one per physical GPU, made on first use, kept for the life of
// the process (as streams are). See device_error.h.
#include "kernels/cuda/device_error.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <new>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

constexpr int kMaxGpus = 64;

struct Slot {
  int gpu = 0;
  unsigned int* claim = nullptr;        // device memory
  DeviceErrorRecord* host = nullptr;    // page-locked, mapped
  DeviceErrorRecord* device = nullptr;  // the same memory, as the GPU addresses it
};

std::array<std::atomic<Slot*>, kMaxGpus> slots{};
std::mutex slots_mutex;  // creating a slot; raising (so that two threads never report one error twice)

// Zeroes the claim word and waits for it, on a private stream: the next report on this GPU
// may come from any stream, so the zero must have landed before this returns, and waiting
// for a stream of weft's own could wait for unrelated work (a collective, say).
void reset_claim(const Slot& slot) {
  int previous = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&previous));
  WEFT_CUDA_CHECK(cudaSetDevice(slot.gpu));
  cudaStream_t stream = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t status = cudaMemsetAsync(slot.claim, 0, sizeof(unsigned int), stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaSetDevice(previous);
  WEFT_CUDA_CHECK(status);
}

Slot* create_slot(int gpu) {
  auto slot = std::make_unique<Slot>();
  slot->gpu = gpu;
  void* host = nullptr;
  WEFT_CUDA_CHECK(cudaHostAlloc(&host, sizeof(DeviceErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
  slot->host = new (host) DeviceErrorRecord();
  void* device = nullptr;
  WEFT_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
  slot->device = static_cast<DeviceErrorRecord*>(device);
  int previous = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&previous));
  WEFT_CUDA_CHECK(cudaSetDevice(gpu));
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&slot->claim), sizeof(unsigned int));
  cudaSetDevice(previous);
  if (status != cudaSuccess) cudaFreeHost(host);
  WEFT_CUDA_CHECK(status);
  reset_claim(*slot);
  return slot.release();
}

}  // namespace

DeviceErrorSink device_error_sink(Device device) {
  const int gpu = physical_device(device);
  WEFT_CHECK(gpu < kMaxGpus, "device-side error records: GPU ", gpu, " is beyond the ", kMaxGpus, " supported");
  Slot* slot = slots[static_cast<size_t>(gpu)].load(std::memory_order_acquire);
  if (slot == nullptr) [[unlikely]] {
    std::lock_guard<std::mutex> lock(slots_mutex);
    slot = slots[static_cast<size_t>(gpu)].load(std::memory_order_acquire);
    if (slot == nullptr) {
      slot = create_slot(gpu);
      slots[static_cast<size_t>(gpu)].store(slot, std::memory_order_release);
    }
  }
  return DeviceErrorSink{slot->claim, slot->device, static_cast<int32_t>(device.index)};
}

void raise_pending_device_error() {
  for (const std::atomic<Slot*>& entry : slots) {
    const Slot* slot = entry.load(std::memory_order_acquire);
    if (slot == nullptr) continue;
    // The GPU writes the fields, fences (system scope), then sets kind: an acquire load of
    // kind orders the reads of the fields after it on any host, Arm's included.
    std::atomic_ref<int32_t> kind(slot->host->kind);
    if (kind.load(std::memory_order_acquire) == 0) [[likely]] continue;
    DeviceErrorRecord record;
    {
      std::lock_guard<std::mutex> lock(slots_mutex);
      if (kind.load(std::memory_order_acquire) == 0) continue;  // another thread raised it
      const volatile DeviceErrorRecord* pending = slot->host;  // written by the GPU: read each time
      record.kind = pending->kind;
      record.device_index = pending->device_index;
      record.op = pending->op;
      record.value = pending->value;
      record.position = pending->position;
      record.bound = pending->bound;
      record.ignore_index = pending->ignore_index;
      kind.store(0, std::memory_order_release);  // before the claim is given back to the GPU
      reset_claim(*slot);
    }
    WEFT_FAIL(describe_device_error(record));
  }
}

}  // namespace weft::cuda
