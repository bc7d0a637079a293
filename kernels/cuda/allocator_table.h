// AllocatorTable: every logical CUDA device's allocator, created on first use, and what
// they do together when one of them runs out of memory.
//
// Note [Out of memory on a shared GPU]: with WEFT_VIRTUAL_DEVICES several logical devices
// share one GPU, each with its own allocator. Memory that cuda:1 caches is memory that
// cuda:0 cannot have, and emptying only the requester's cache would fail an allocation
// that the GPU could serve. So an allocator that the device refuses even after emptying
// its own cache calls relieve(): it synchronises the GPU (blocks that were waiting for
// other streams become free) and empties the cache of every allocator on that GPU, one
// at a time (each under its own lock; the requester holds none, so two allocators that
// run out together cannot deadlock), and the requester retries. Only then does it fail,
// saying what was given back and what every logical device on the GPU still holds.
//
// Plain C++ (allocators are made by a factory, the GPU of a device comes from a function),
// so that the relief is tested without a GPU on fake devices that share a capacity.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_plan.h"

namespace weft::cuda {

class AllocatorTable {
 public:
  using Factory = std::function<std::unique_ptr<DeviceAllocator>(Device)>;
  using PhysicalOf = std::function<int(Device)>;  // the GPU of a logical device; throws for a bad one

  AllocatorTable(Factory make, PhysicalOf physical_of);
  ~AllocatorTable();
  AllocatorTable(const AllocatorTable&) = delete;
  AllocatorTable& operator=(const AllocatorTable&) = delete;

  // The allocator of `device` (a logical CUDA device), made on first use.
  DeviceAllocator& get(Device device);

  // Note [Out of memory on a shared GPU]: synchronises GPU `physical`, empties the cache of
  // every allocator on it, and says what was given back and what the others (not
  // `requester`, whose own figures its error gives) still hold.
  std::string relieve(int physical, Device requester);

 private:
  Factory make_;
  PhysicalOf physical_of_;
  std::array<std::atomic<DeviceAllocator*>, kMaxLogicalDevices> by_index_{};
  std::array<int, kMaxLogicalDevices> physical_{};  // written before by_index_ publishes the allocator
  std::mutex mutex_;                                 // serialises creation
};

}  // namespace weft::cuda
