// DataLoader: batches from a Dataset in a sampler's order, optionally loaded ahead by
// worker threads (PyTorch's torch.utils.data.DataLoader, with threads for processes).
//
//   auto train = std::make_shared<data::FashionMNIST>();
//   data::DataLoader loader(train, {.batch_size = 100, .shuffle = true, .num_workers = 2});
//   for (int epoch = 0; epoch < 3; ++epoch) {
//     loader.set_epoch(epoch);
//     for (data::Batch& batch : loader) { ... batch.data [100, 1, 28, 28], batch.target [100] ... }
//   }
//
// Note [Loader determinism]: the batches, their order and any random numbers a dataset
// draws are the same for every num_workers. Workers claim batch indices in order, and a
// batch is handed to the consumer only when all batches before it have been; a dataset
// that needs randomness takes it from batch_generator(), seeded by (seed, epoch, batch
// index) — never by the worker that happens to load the batch.
//
// Order changes only with set_epoch() (see sampler.h): call it at the start of each epoch.
// set_start(C) resumes an epoch after its first C samples (Note [Starting part-way into an
// epoch] in sampler.h). Batch indices, and so the batch_generator() seeds, count from the
// epoch's start, not the pass's: after set_start(C) the first batch is number
// sampler.local_start() / batch_size. When C is a whole number of batches (what TrainLoop's
// checkpoints record) a resumed pass therefore loads exactly the batches, random draws
// included, that the uninterrupted pass loaded after its first C samples.
// Only one pass runs at a time: begin() ends the previous pass (its iterators then throw).
// Loading runs with grad mode off.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>

#include "core/generator.h"
#include "data/dataset.h"
#include "data/sampler.h"

namespace weft::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;      // a RandomSampler(dataset size, seed); not with a custom sampler
  bool drop_last = false;    // drop the last batch when it is short
  int64_t num_workers = 0;   // 0: load on the consumer's thread; N: N worker threads
  int64_t prefetch_factor = 2;  // with workers, at most num_workers * prefetch_factor batches ahead
  bool pin_memory = false;   // see pin_batch()
  uint64_t seed = 0;         // seeds the shuffle and batch_generator()
};

// The generator for the batch being loaded on this thread: inside Dataset::get_batch /
// get called by a DataLoader it is seeded derive_seed(seed, epoch, batch index + 1) (stream
// 0 is the loader's shuffle; the index counts from the epoch's start, see set_start);
// elsewhere it is default_generator().
Generator& batch_generator();

// Stages a batch in page-locked (pinned) host memory, so that its host-to-device copy is
// asynchronous and overlaps compute (PyTorch's pin_memory); workers call it when
// pin_memory is set. Without a usable GPU the batch is returned unchanged.
Batch pin_batch(Batch batch);

class DataLoader {
 public:
  // sampler: a custom index order (a DistributedSampler for DDP); null means
  // SequentialSampler, or RandomSampler(dataset->size(), seed) when options.shuffle.
  explicit DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {},
                      std::shared_ptr<Sampler> sampler = nullptr);
  // Stops the workers of a running pass: each finishes the batch it is loading, then
  // joins. Never throws.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  class Pass;  // one iteration over the batches: the batch list, the workers and the queue

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;  // the end
    Batch& operator*() const;
    Batch* operator->() const { return &**this; }
    // Loads (or waits for) the next batch; rethrows, here, an exception that loading it
    // raised. After such an exception the pass goes on with the batch after it.
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return at_end() == other.at_end(); }

   private:
    friend class DataLoader;
    explicit Iterator(std::shared_ptr<Pass> pass) : pass_(std::move(pass)) {}
    bool at_end() const;
    std::shared_ptr<Pass> pass_;
  };

  // Starts a pass and loads its first batch (an exception loading it is thrown here).
  Iterator begin();
  Iterator end() { return Iterator(); }

  // Batches per pass (len(loader)); after set_start, those left.
  int64_t size() const { return batch_sampler_.size(); }
  void set_epoch(int64_t epoch) { batch_sampler_.set_epoch(epoch); }
  int64_t epoch() const { return batch_sampler_.epoch(); }
  // The next passes skip the epoch's first `consumed` samples (global, over every rank of a
  // DistributedSampler) until set_start(0). The sampler must support it (sampler.h).
  void set_start(int64_t consumed) { batch_sampler_.set_start(consumed); }
  int64_t start() const { return batch_sampler_.start(); }
  // The epoch's batch number of a pass's first batch: 0 but after set_start.
  int64_t first_batch() const { return batch_sampler_.first_batch(); }

  const DataLoaderOptions& options() const { return options_; }
  // The dataset, shared: what a caller needs to build another loader over the same data
  // (TrainLoop swaps in a DistributedSampler for DDP).
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  Sampler& sampler() const { return batch_sampler_.sampler(); }

 private:
  void end_pass() noexcept;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  BatchSampler batch_sampler_;
  std::shared_ptr<Pass> pass_;
};

}  // namespace weft::data
