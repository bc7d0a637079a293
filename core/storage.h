// Storage: a reference-counted block of device memory that tensors view.
//
// Views alias one storage; sizes, strides and offset live on the tensor. The version
// counter lives here too, so that every view of the same bytes shares it: autograd
// records the version of each tensor it saves and refuses to use one that an in-place
// op has changed since (see SavedTensor in core/autograd.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/allocator.h"

namespace weft {

class StorageImpl {
 public:
  StorageImpl(size_t nbytes, Allocator& allocator)
      : data_(allocator.allocate(nbytes)), nbytes_(nbytes), allocator_(&allocator), device_(allocator.device()) {}
  ~StorageImpl() { allocator_->deallocate(data_, nbytes_); }
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  const Allocator& allocator() const { return *allocator_; }
  uint32_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_;
  size_t nbytes_;
  Allocator* allocator_;
  Device device_;
  uint32_t version_ = 0;
};

using Storage = std::shared_ptr<StorageImpl>;

inline Storage make_storage(size_t nbytes, Device device) {
  return std::make_shared<StorageImpl>(nbytes, allocator_for(device));
}

}  // namespace weft
