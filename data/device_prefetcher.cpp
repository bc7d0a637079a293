// DevicePrefetcher: see device_prefetcher.h.
#include "data/device_prefetcher.h"

#include <exception>
#include <optional>

#include "core/error.h"
#include "core/stream.h"

namespace weft::data {

// One pass: the loader's iterator, the batch handed out, and the staged one — the next
// batch, uploading, or the error that loading or uploading it raised.
class DevicePrefetcher::Staging {
 public:
  Staging(DataLoader& loader, Device device)
      : loader_(loader), device_(device), upload_stream_(upload_stream(device)) {
    stage();
    advance();  // hands out the first batch (or throws its error), stages the second
  }

  // Hands out the staged batch and stages the next. A staged error is rethrown here, with
  // the batch handed out before it still current; the next advance() goes on after it.
  void advance() {
    std::optional<Staged> item = std::move(staged_);
    stage();
    if (!item) {
      current_.reset();
      return;
    }
    if (item->error) std::rethrow_exception(item->error);
    wait_for(*item);
    current_ = std::move(item->batch);
  }

  const std::optional<Batch>& current() const { return current_; }

 private:
  struct Staged {
    Batch batch;
    std::exception_ptr error;
    Event uploaded;  // recorded on the upload stream after the batch's copies
  };

  // Stages the loader's next batch; never throws (an error is staged instead).
  void stage() {
    staged_.reset();
    try {
      if (!started_) {
        started_ = true;
        next_ = loader_.begin();
      } else if (next_ != DataLoader::Iterator()) {
        ++next_;
      }
      if (next_ == DataLoader::Iterator()) return;
      staged_.emplace();
      upload(*next_, *staged_);
    } catch (...) {
      staged_.emplace();
      staged_->error = std::current_exception();
    }
  }

  Tensor to_device(const Tensor& t) const { return t.defined() ? t.to(device_) : t; }

  void upload(const Batch& batch, Staged& staged) {
    StreamGuard on_upload_stream(upload_stream_);
    staged.batch = {to_device(batch.data), to_device(batch.target)};
    staged.uploaded.record(upload_stream_);
  }

  // Work queued from now on, on the current stream, sees the batch uploaded; its memory
  // is not reused before that work is done.
  void wait_for(const Staged& staged) {
    const Stream stream = current_stream(device_);
    staged.uploaded.block(stream);
    for (const Tensor& t : {staged.batch.data, staged.batch.target})
      if (t.defined() && t.device() == device_) record_stream(t, stream);
  }

  DataLoader& loader_;
  Device device_;
  bool started_ = false;
  DataLoader::Iterator next_;  // at the staged batch
  std::optional<Batch> current_;
  std::optional<Staged> staged_;
  Stream upload_stream_;
};

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device) : loader_(loader), device_(device) {}

DevicePrefetcher::Iterator DevicePrefetcher::begin() {
  return Iterator(std::make_shared<Staging>(loader_, device_));
}

const Batch& DevicePrefetcher::Iterator::operator*() const {
  WEFT_CHECK(!at_end(), "DevicePrefetcher: dereferenced past the last batch");
  return *staging_->current();
}

DevicePrefetcher::Iterator& DevicePrefetcher::Iterator::operator++() {
  WEFT_CHECK(!at_end(), "DevicePrefetcher: advanced past the last batch");
  staging_->advance();
  return *this;
}

bool DevicePrefetcher::Iterator::at_end() const { return staging_ == nullptr || !staging_->current(); }

}  // namespace weft::data
