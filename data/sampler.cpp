// Samplers: index arithmetic (PyTorch's), permutations from weft::randperm.
#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "kernels/random.h"

namespace weft::data {

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> out(n);
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

std::vector<int64_t> permutation(int64_t n, uint64_t generator_seed) {
  Generator gen(generator_seed);
  return randperm(n, DType::Int64, &gen).to_vector<int64_t>();
}

// `list` without its first `count` entries (all of them when count >= size).
std::vector<int64_t> drop_front(std::vector<int64_t> list, int64_t count) {
  list.erase(list.begin(), list.begin() + std::min<int64_t>(count, static_cast<int64_t>(list.size())));
  return list;
}

void check_size(int64_t n, const char* who) {
  WEFT_CHECK(n >= 0, who, ": the dataset size must be non-negative, got ", n);
}

void check_replicas(int64_t num_replicas, int64_t rank, const char* who) {
  WEFT_CHECK(num_replicas >= 1, who, ": num_replicas must be at least 1, got ", num_replicas);
  WEFT_CHECK(rank >= 0 && rank < num_replicas, who, ": invalid rank ", rank, ", rank should be in the interval [0, ",
             num_replicas - 1, "] for num_replicas = ", num_replicas);
}

}  // namespace

uint64_t derive_seed(uint64_t seed, uint64_t epoch, uint64_t stream) {
  auto words = philox4x32(seed, epoch, stream);
  return (static_cast<uint64_t>(words[1]) << 32) | words[0];
}

void Sampler::set_start(int64_t consumed) {
  WEFT_CHECK(consumed == 0, "Sampler::set_start(", consumed, "): this sampler cannot start part-way into an epoch "
             "(override set_start to support resuming mid-epoch; SequentialSampler, RandomSampler and "
             "DistributedSampler do)");
  record_start(0);
}

void Sampler::record_start(int64_t consumed) {
  WEFT_CHECK(consumed >= 0, "Sampler::set_start: the samples consumed must be non-negative, got ", consumed);
  start_ = consumed;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) { check_size(n, "SequentialSampler"); }

std::vector<int64_t> SequentialSampler::indices() const { return drop_front(iota(n_), start()); }

std::string SequentialSampler::global_order() const {
  return "the dataset's order of " + std::to_string(n_) + " samples";
}

std::string RandomSampler::global_order() const {
  return "RandomSampler's order of " + std::to_string(n_) + " samples, seed " + std::to_string(seed_);
}

std::string DistributedSampler::global_order() const {
  if (!shuffle_) return SequentialSampler(dataset_size_).global_order();
  return "DistributedSampler's order of " + std::to_string(dataset_size_) + " samples, seed " + std::to_string(seed_);
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) { check_size(n, "RandomSampler"); }

std::vector<int64_t> RandomSampler::indices() const {
  return drop_front(permutation(n_, derive_seed(seed_, static_cast<uint64_t>(epoch()))), start());
}

BatchSampler::BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  WEFT_CHECK(sampler_ != nullptr, "BatchSampler: the sampler is null");
  WEFT_CHECK(batch_size >= 1, "BatchSampler: batch_size must be at least 1, got ", batch_size);
}

int64_t BatchSampler::size() const {
  int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

std::vector<std::vector<int64_t>> BatchSampler::batches() const {
  std::vector<int64_t> all = sampler_->indices();
  int64_t n = static_cast<int64_t>(all.size());
  int64_t count = drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  std::vector<std::vector<int64_t>> out(count);
  for (int64_t b = 0; b < count; ++b) {
    auto first = all.begin() + b * batch_size_;
    out[b].assign(first, first + std::min(batch_size_, n - b * batch_size_));
  }
  return out;
}

// --- DistributedSampler --------------------------------------------------------------

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_size(dataset_size, "DistributedSampler");
  check_replicas(num_replicas, rank, "DistributedSampler");
}

int64_t DistributedSampler::num_samples() const {
  // PyTorch: ceil((n - R) / R) with drop_last and a remainder, which is floor(n / R) (0
  // when n < R); otherwise ceil(n / R). Here n is what is left of the epoch.
  const int64_t n = remaining();
  if (drop_last_ && n % num_replicas_ != 0) return n / num_replicas_;
  return (n + num_replicas_ - 1) / num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> all = shuffle_ ? permutation(dataset_size_, seed_ + static_cast<uint64_t>(epoch()))
                                            : iota(dataset_size_);
  // Global position start() + j of the epoch's order, which wraps around the permutation (as
  // many times as needed: n < total - n happens when n < R) to pad; with drop_last the
  // total is at most what is left, and the tail is cut.
  const int64_t n = dataset_size_, total = total_size();
  std::vector<int64_t> mine;
  mine.reserve(total / num_replicas_);
  for (int64_t j = rank_; j < total; j += num_replicas_) mine.push_back(all[(start() + j) % n]);
  return mine;
}

// --- DistributedEvalSampler ----------------------------------------------------------

DistributedEvalSampler::DistributedEvalSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                               EvalShard shard, bool shuffle, uint64_t seed)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), shard_(shard), shuffle_(shuffle), seed_(seed) {
  check_size(dataset_size, "DistributedEvalSampler");
  check_replicas(num_replicas, rank, "DistributedEvalSampler");
}

int64_t DistributedEvalSampler::size() const {
  const int64_t n = dataset_size_, r = num_replicas_;
  if (shard_ == EvalShard::Contiguous) return n / r + (rank_ < n % r ? 1 : 0);
  return rank_ < n ? (n - rank_ + r - 1) / r : 0;
}

std::vector<int64_t> DistributedEvalSampler::indices() const {
  std::vector<int64_t> all = shuffle_ ? permutation(dataset_size_, seed_ + static_cast<uint64_t>(epoch()))
                                      : iota(dataset_size_);
  std::vector<int64_t> mine;
  mine.reserve(size());
  if (shard_ == EvalShard::Contiguous) {
    const int64_t base = dataset_size_ / num_replicas_, extra = dataset_size_ % num_replicas_;
    const int64_t start = rank_ * base + std::min(rank_, extra);
    mine.assign(all.begin() + start, all.begin() + start + size());
  } else {
    for (int64_t i = rank_; i < dataset_size_; i += num_replicas_) mine.push_back(all[i]);
  }
  return mine;
}

}  // namespace weft::data
