// DataLoader: one Pass per iteration; with workers, a bounded in-order queue.
//
// Note [Loader queue]: batch b lives in slot b % capacity of a ring of capacity
// num_workers * prefetch_factor. A worker may claim batch b only while
// b < next_deliver + capacity, so the batches being loaded or waiting are always the
// `capacity` ones after the last delivered batch and never share a slot. The consumer
// waits for its slot to fill; workers wait for room. Every exception a load throws is
// caught and stored in the slot, so a failing batch can neither kill a thread nor leave
// the consumer waiting.
#include "data/dataloader.h"

#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/cpu/parallel.h"

namespace weft::data {

namespace {

thread_local Generator* current_batch_generator = nullptr;

// Makes batch_generator() return `gen` on this thread while a batch loads.
class BatchGeneratorScope {
 public:
  explicit BatchGeneratorScope(Generator& gen) : previous_(current_batch_generator) { current_batch_generator = &gen; }
  ~BatchGeneratorScope() { current_batch_generator = previous_; }
  BatchGeneratorScope(const BatchGeneratorScope&) = delete;
  BatchGeneratorScope& operator=(const BatchGeneratorScope&) = delete;

 private:
  Generator* previous_;
};

std::shared_ptr<Sampler> make_sampler(const std::shared_ptr<const Dataset>& dataset, const DataLoaderOptions& options,
                                      std::shared_ptr<Sampler> sampler) {
  WEFT_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  WEFT_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", options.batch_size);
  WEFT_CHECK(options.num_workers >= 0, "DataLoader: num_workers must be non-negative, got ", options.num_workers);
  WEFT_CHECK(options.prefetch_factor >= 1, "DataLoader: prefetch_factor must be at least 1, got ",
             options.prefetch_factor);
  if (sampler) {
    WEFT_CHECK(!options.shuffle, "DataLoader: shuffle=true cannot be combined with a custom sampler (the sampler "
               "decides the order; shuffle in the sampler instead)");
    return sampler;
  }
  if (options.shuffle) return std::make_shared<RandomSampler>(dataset->size(), options.seed);
  return std::make_shared<SequentialSampler>(dataset->size());
}

}  // namespace

Generator& batch_generator() { return current_batch_generator ? *current_batch_generator : default_generator(); }

Batch pin_batch(Batch batch) {
  if (!cuda_available()) return batch;
  batch.data = batch.data.pin_memory();
  batch.target = batch.target.pin_memory();
  return batch;
}

// --- Pass ----------------------------------------------------------------------------

class DataLoader::Pass {
 public:
  Pass(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options, int64_t epoch, int64_t first_batch,
       std::vector<std::vector<int64_t>> batches)
      : dataset_(std::move(dataset)),
        options_(options),
        epoch_(epoch),
        first_batch_(first_batch),
        batches_(std::move(batches)),
        capacity_(options.num_workers * options.prefetch_factor),
        slots_(capacity_) {}

  ~Pass() { stop(); }

  void start_workers() {
    workers_.reserve(options_.num_workers);
    for (int64_t w = 0; w < options_.num_workers; ++w) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (const std::system_error& e) {
        stop();  // the ones already started
        WEFT_FAIL("DataLoader: cannot start worker thread ", w + 1, " of num_workers = ", options_.num_workers,
                  ": ", e.what(), "; use fewer workers");
      }
    }
  }

  // Joins the workers; each first finishes the batch it is loading.
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    room_.notify_all();
    filled_.notify_all();
    for (std::thread& worker : workers_)
      if (worker.joinable()) worker.join();
  }

  bool at_end() const { return position_ >= static_cast<int64_t>(batches_.size()); }

  Batch& current() {
    WEFT_CHECK(!at_end(), "DataLoader: dereferencing the end of a pass");
    return current_;
  }

  void advance() {
    WEFT_CHECK(!at_end(), "DataLoader: advancing past the end of a pass");
    WEFT_CHECK(!stopped_, "DataLoader: this pass has ended (begin() started a new one or the loader was destroyed)");
    current_ = Batch();
    if (++position_ == static_cast<int64_t>(batches_.size())) {
      stop();  // the workers have nothing left to claim: release their threads now
      return;
    }
    Slot slot = workers_.empty() ? load(position_) : take(position_);
    if (slot.error) std::rethrow_exception(slot.error);
    current_ = std::move(slot.batch);
  }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  Slot load(int64_t index) const {
    Slot slot;
    try {
      NoGradGuard no_grad;
      // Numbered within the epoch, not the pass: a resumed pass draws what the whole one did.
      const uint64_t number = static_cast<uint64_t>(first_batch_ + index);
      Generator gen(derive_seed(options_.seed, static_cast<uint64_t>(epoch_), number + 1));
      BatchGeneratorScope scope(gen);
      slot.batch = dataset_->get_batch(batches_[index]);
      if (options_.pin_memory) slot.batch = pin_batch(std::move(slot.batch));
    } catch (...) {
      slot.error = std::current_exception();
    }
    return slot;
  }

  void work() {
    // One kernel thread per worker, as PyTorch's workers run (torch.set_num_threads(1)):
    // N workers each opening a full OpenMP team would oversubscribe the cores. The
    // setting is per thread, and kernels give the same values for any thread count.
    set_num_threads(1);
    const int64_t count = static_cast<int64_t>(batches_.size());
    while (true) {
      int64_t index;
      {
        std::unique_lock lock(mutex_);
        room_.wait(lock, [&] { return stopped_ || next_claim_ >= count || next_claim_ < next_deliver_ + capacity_; });
        if (stopped_ || next_claim_ >= count) return;
        index = next_claim_++;
      }
      Slot slot = load(index);
      {
        std::lock_guard lock(mutex_);
        slots_[index % capacity_] = std::move(slot);
      }
      filled_.notify_all();
    }
  }

  Slot take(int64_t index) {
    std::unique_lock lock(mutex_);
    std::optional<Slot>& slot = slots_[index % capacity_];
    filled_.wait(lock, [&] { return stopped_ || slot.has_value(); });
    WEFT_CHECK(slot.has_value(), "DataLoader: this pass has ended while waiting for batch ", index);
    Slot out = std::move(*slot);
    slot.reset();
    next_deliver_ = index + 1;
    lock.unlock();
    room_.notify_all();
    return out;
  }

  const std::shared_ptr<const Dataset> dataset_;
  const DataLoaderOptions options_;
  const int64_t epoch_;
  const int64_t first_batch_;  // the epoch's number of batches_[0]
  const std::vector<std::vector<int64_t>> batches_;
  const int64_t capacity_;

  // Consumer-side state (touched only by the consumer's thread).
  int64_t position_ = -1;
  Batch current_;

  // Shared with the workers, under mutex_.
  std::mutex mutex_;
  std::condition_variable room_, filled_;
  std::vector<std::optional<Slot>> slots_;
  int64_t next_claim_ = 0, next_deliver_ = 0;
  bool stopped_ = false;
  std::vector<std::thread> workers_;
};

// --- DataLoader ----------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)),
      options_(options),
      batch_sampler_(make_sampler(dataset_, options_, std::move(sampler)), options.batch_size, options.drop_last) {
  if (options_.pin_memory && !cuda_available()) {
    static std::once_flag logged;
    std::call_once(logged, [] {
      std::cerr << "weft: DataLoader pin_memory=true has no effect without a usable CUDA GPU; batches stay in pageable "
                   "memory\n";
    });
  }
}

DataLoader::~DataLoader() { end_pass(); }

void DataLoader::end_pass() noexcept {
  if (pass_) pass_->stop();
  pass_.reset();
}

DataLoader::Iterator DataLoader::begin() {
  end_pass();
  pass_ = std::make_shared<Pass>(dataset_, options_, batch_sampler_.epoch(), batch_sampler_.first_batch(),
                                 batch_sampler_.batches());
  pass_->start_workers();
  Iterator it(pass_);
  pass_->advance();
  return it;
}

Batch& DataLoader::Iterator::operator*() const {
  WEFT_CHECK(pass_ != nullptr, "DataLoader: dereferencing the end iterator");
  return pass_->current();
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  WEFT_CHECK(pass_ != nullptr, "DataLoader: advancing the end iterator");
  pass_->advance();
  return *this;
}

bool DataLoader::Iterator::at_end() const { return pass_ == nullptr || pass_->at_end(); }

}  // namespace weft::data
