// DevicePrefetcher: a DataLoader's batches moved to a device one batch ahead, so that the
// upload of batch i + 1 overlaps the compute on batch i (the "data prefetcher" of
// NVIDIA's PyTorch examples).
//
//   data::DataLoader loader(train, {.batch_size = 128, .shuffle = true, .num_workers = 2,
//                                   .pin_memory = true});
//   for (const data::Batch& batch : data::DevicePrefetcher(loader, Device::cuda(0))) {
//     ... batch.data and batch.target are on cuda:0 ...
//   }
//
// Every upload runs on the device's upload stream (core/stream.h), not on the stream that
// computes: taking batch i makes the current stream wait for its upload (an event, no
// host synchronisation), marks its memory as used by that stream (record_stream), and
// starts uploading batch i + 1. On a GPU, from pinned memory (DataLoaderOptions::
// pin_memory), that copy runs while the kernels of batch i do; on a CPU device the same
// steps cost nothing and the batch is simply moved one batch ahead.
//
// The batches and their order are the loader's: only where they live changes. As with
// the loader, an error loading (or uploading) a batch is raised by the ++ that would hand
// it out, and the pass then goes on with the batch after it; one pass at a time: begin()
// starts a loader pass, which ends the previous one. Copies of an iterator share its pass.
#pragma once

#include <memory>

#include "core/device.h"
#include "data/dataloader.h"

namespace weft::data {

class DevicePrefetcher {
 public:
  DevicePrefetcher(DataLoader& loader, Device device);
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  class Staging;  // the loader's iterator, the current and the staged batch

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator() = default;  // the end
    const Batch& operator*() const;
    const Batch* operator->() const { return &**this; }
    // Hands out the staged batch and starts staging the one after it; rethrows, here, an
    // exception that loading or uploading the staged batch raised.
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return at_end() == other.at_end(); }

   private:
    friend class DevicePrefetcher;
    explicit Iterator(std::shared_ptr<Staging> staging) : staging_(std::move(staging)) {}
    bool at_end() const;
    std::shared_ptr<Staging> staging_;
  };

  // Starts the loader's pass, hands out its first batch and stages the second.
  Iterator begin();
  Iterator end() { return Iterator(); }

  Device device() const { return device_; }

 private:
  DataLoader& loader_;
  Device device_;
};

}  // namespace weft::data
