// The table of per-device allocators and the out-of-memory relief across a GPU (see
// allocator_table.h). Plain C++: no CUDA here.
#include "kernels/cuda/allocator_table.h"

#include <sstream>

#include "core/error.h"

namespace weft::cuda {

AllocatorTable::AllocatorTable(Factory make, PhysicalOf physical_of)
    : make_(std::move(make)), physical_of_(std::move(physical_of)) {}

AllocatorTable::~AllocatorTable() {
  // Only tests destroy a table (the process's one lives for the process).
  for (auto& slot : by_index_) delete slot.load();
}

DeviceAllocator& AllocatorTable::get(Device device) {
  const int physical = physical_of_(device);  // a clear error for a CPU device or an index out of range
  WEFT_CHECK(device.index >= 0 && device.index < kMaxLogicalDevices, "no allocator for ", device, ": at most ",
             kMaxLogicalDevices, " logical CUDA devices");
  const auto index = static_cast<size_t>(device.index);
  if (DeviceAllocator* existing = by_index_[index].load(std::memory_order_acquire)) [[likely]]
    return *existing;
  std::lock_guard lock(mutex_);
  if (DeviceAllocator* existing = by_index_[index].load(std::memory_order_relaxed)) return *existing;
  std::unique_ptr<DeviceAllocator> created = make_(device);
  created->set_out_of_memory_relief([this, physical, device] { return relieve(physical, device); });
  physical_[index] = physical;
  by_index_[index].store(created.get(), std::memory_order_release);
  return *created.release();
}

std::string AllocatorTable::relieve(int physical, Device requester) {
  std::vector<DeviceAllocator*> sharing;
  for (size_t i = 0; i < by_index_.size(); ++i) {
    DeviceAllocator* a = by_index_[i].load(std::memory_order_acquire);
    if (a != nullptr && physical_[i] == physical) sharing.push_back(a);
  }
  int64_t given_back = 0;
  for (DeviceAllocator* a : sharing) given_back += a->synchronize_and_empty_cache();

  std::ostringstream out;
  out << "after synchronising GPU " << physical << " and emptying the cache";
  if (sharing.size() > 1) out << "s";
  out << " of ";
  for (size_t i = 0; i < sharing.size(); ++i)
    out << (i == 0 ? "" : i + 1 == sharing.size() ? " and " : ", ") << sharing[i]->device();
  out << " (" << format_bytes(given_back) << " given back)";
  for (DeviceAllocator* a : sharing) {
    if (a->device() == requester) continue;
    const AllocatorStats s = a->stats();
    out << "; " << a->device() << " on the same GPU holds " << format_bytes(s.bytes_in_use)
        << " in use by tensors and " << format_bytes(a->cached_bytes()) << " cached";
  }
  return out.str();
}

}  // namespace weft::cuda
