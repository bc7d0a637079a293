// DevicePrefetcher: see device_prefetcher.h.
#include "data/device_prefetcher.h"

#include <optional>

#include "core/error.h"

#ifdef WEFT_WITH_CUDA
#include "kernels/cuda/memory.h"
#include "kernels/cuda/stream.h"
#endif

namespace weft::data {

// One pass: the loader's iterator, the batch handed out and the batch being uploaded.
class DevicePrefetcher::Staging {
 public:
  Staging(DataLoader& loader, Device device) : device_(device), next_(loader.begin()) {
#ifdef WEFT_WITH_CUDA
    if (device.is_cuda()) copy_stream_ = cuda::upload_stream(device);
#endif
    advance();  // stages the first batch
    advance();  // hands it out, stages the second
  }

  // The staged batch becomes the current one and the loader's next batch is staged. The
  // loader's ++ comes first: an exception it raises (loading the batch after the staged
  // one) leaves the pass as it was, and the next advance() goes on past that batch.
  void advance() {
    if (next_is_staged_) {
      ++next_;
      next_is_staged_ = false;
    }
    current_ = std::move(staged_);
    staged_.reset();
    if (current_) wait_for(*current_);
    if (next_ == DataLoader::Iterator()) return;
    staged_ = upload(*next_);
    next_is_staged_ = true;
  }

  const std::optional<Batch>& current() const { return current_; }

 private:
  Batch upload(const Batch& batch) {
#ifdef WEFT_WITH_CUDA
    if (copy_stream_) {
      cuda::StreamGuard on_copy_stream(*copy_stream_);
      Batch uploaded{batch.data.to(device_), batch.target.to(device_)};
      uploaded_.record(*copy_stream_);
      return uploaded;
    }
#endif
    return {batch.data.to(device_), batch.target.to(device_)};
  }

  // Work queued from now on, on the current stream, sees the batch uploaded; its memory
  // is not reused before that work is done.
  void wait_for(const Batch& batch) {
#ifdef WEFT_WITH_CUDA
    if (!copy_stream_) return;
    const cuda::Stream stream = cuda::current_stream(device_);
    uploaded_.block(stream);
    for (const Tensor& t : {batch.data, batch.target})
      if (t.defined()) cuda::record_stream(t, stream);
#else
    (void)batch;
#endif
  }

  Device device_;
  DataLoader::Iterator next_;
  bool next_is_staged_ = false;  // next_ stands at the staged batch: ++ before staging another
  std::optional<Batch> current_, staged_;
#ifdef WEFT_WITH_CUDA
  std::optional<cuda::Stream> copy_stream_;
  cuda::Event uploaded_;  // recorded after the staged batch's upload
#endif
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
