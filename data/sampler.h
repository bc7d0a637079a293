// Samplers: the order in which a DataLoader visits a dataset, one index list per epoch
// (PyTorch's torch.utils.data samplers and DistributedSampler).
//
// A sampler is a pure function of its configuration and the epoch set with set_epoch():
// calling indices() twice gives the same list, and the list changes only when the epoch
// does. That is what makes runs repeat and what lets every DDP rank compute its share of
// one common permutation without talking to the others. (PyTorch's RandomSampler without
// a generator instead reshuffles on every pass from the global RNG; in weft, call
// set_epoch(epoch) at the start of each epoch, as PyTorch requires for DistributedSampler.)
//
// Random permutations come from weft::randperm (Philox), so a shuffled order does not equal
// the one torch.randperm would give for the same seed. Everything else (sizes, padding,
// striding, drop_last) follows PyTorch exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace weft::data {

// A 64-bit seed for stream `stream` of epoch `epoch` of a run seeded `seed`: one Philox
// block keyed by seed, so that nearby (seed, epoch) pairs give unrelated streams
// (seed + epoch would make seed 0 epoch 1 equal seed 1 epoch 0).
uint64_t derive_seed(uint64_t seed, uint64_t epoch, uint64_t stream = 0);

class Sampler {
 public:
  virtual ~Sampler() = default;

  // The number of indices indices() returns (len(sampler) in PyTorch).
  virtual int64_t size() const = 0;
  // This epoch's index sequence.
  virtual std::vector<int64_t> indices() const = 0;

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 private:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n - 1.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t n_;
};

// A permutation of 0 .. n - 1 drawn with randperm from a generator seeded
// derive_seed(seed, epoch). Without replacement (PyTorch's replacement / num_samples
// options are not offered).
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

// Groups another sampler's indices into batches of batch_size; the last batch is shorter
// unless drop_last drops it. set_epoch() reaches the wrapped sampler.
class BatchSampler {
 public:
  BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last);

  // Number of batches: floor(n / batch_size) with drop_last, else ceil(n / batch_size).
  int64_t size() const;
  std::vector<std::vector<int64_t>> batches() const;
  void set_epoch(int64_t epoch) { sampler_->set_epoch(epoch); }
  int64_t epoch() const { return sampler_->epoch(); }

  Sampler& sampler() const { return *sampler_; }
  int64_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }

 private:
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
};

// The share of rank `rank` among num_replicas processes, PyTorch's DistributedSampler:
//   num_samples = drop_last && n % R != 0 ? ceil((n - R) / R) : ceil(n / R)
//   total_size  = num_samples * R
//   indices     = shuffle ? randperm(n) with a generator seeded seed + epoch : 0 .. n - 1
//   !drop_last: indices padded to total_size by repeating the list from its start (as many
//               times as needed); drop_last: truncated to total_size
//   rank r gets indices[r : total_size : R]
// e.g. n = 10, R = 3: total_size 12, ranks get {0,3,6,9}, {1,4,7,0}, {2,5,8,1}; with
// drop_last total_size 9 and ranks get {0,3,6}, {1,4,7}, {2,5,8}. Every rank gets the same
// number of samples, so DDP's collectives stay in step; the padding repeats some samples.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() const override;

  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return total_size_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  bool drop_last() const { return drop_last_; }

 private:
  int64_t dataset_size_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_, total_size_;
};

// How DistributedEvalSampler splits 0 .. n - 1 (or its permutation) among ranks.
enum class EvalShard {
  Strided,     // rank r gets positions r, r + R, r + 2R, ... (DistributedSampler's layout)
  Contiguous,  // rank r gets one block; the first n % R ranks get one sample more
};

// Evaluation sharding that neither pads nor drops: over all ranks every sample is seen
// exactly once, so metrics summed across ranks are exact. Ranks may get different counts
// (they differ by at most one sample), so code that runs collectives per batch must allow
// for a rank with one batch fewer. With shuffle, the permutation is DistributedSampler's
// (generator seeded seed + epoch).
class DistributedEvalSampler : public Sampler {
 public:
  DistributedEvalSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, EvalShard shard = EvalShard::Strided,
                         bool shuffle = false, uint64_t seed = 0);

  int64_t size() const override;
  std::vector<int64_t> indices() const override;

  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }

 private:
  int64_t dataset_size_, num_replicas_, rank_;
  EvalShard shard_;
  bool shuffle_;
  uint64_t seed_;
};

}  // namespace weft::data
