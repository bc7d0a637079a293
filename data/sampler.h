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
//
// Note [Starting part-way into an epoch]: set_start(C) says that the first C positions of
// this epoch's *global* order are trained already (a run resumed from a checkpoint written
// in the middle of an epoch); indices() then returns what is left. SequentialSampler and
// RandomSampler drop the first C entries of their list. DistributedSampler's global order is
// the epoch's permutation G of 0 .. n - 1 continued cyclically for padding (position i holds
// G[i mod n]); it does not depend on the world size. Rank r of R takes positions r, r + R,
// r + 2R, ..., so after s steps of b samples per rank exactly positions [0, s * b * R) are
// trained: a prefix, C = s * b * R, and C < n before the last step. With start C the
// remainder G[C:] (n - C samples) is sharded over the *current* replicas by the usual rule:
// its length is rounded up to a multiple of R by going on around G (positions n, n + 1, ...:
// G[0], G[1], ..., as an uninterrupted epoch pads) or, with drop_last, cut down to one.
// A job that resumes with another world size thus trains every sample of the epoch once,
// but for fewer than R padding repeats (from the epoch's start, as in any epoch); with the
// same world size its ranks get exactly the rest of the lists they had. C >= n leaves
// nothing. E.g. n = 10, G = 0 .. 9, 2 steps of 1 sample on 2 ranks trained {0, 2} and {1, 3}:
// C = 4. Resumed on 3 ranks, [4 .. 9] gives {4, 7}, {5, 8}, {6, 9}; on 4 ranks, padded with
// G[0], G[1]: {4, 8}, {5, 9}, {6, 0}, {7, 1}; on 4 ranks with drop_last: {4}, {5}, {6}, {7}.
// The start stays set until changed (TrainLoop sets it for a resumed epoch, then back to 0).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
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

  // Skips the epoch's first `consumed` global positions (Note [Starting part-way into an
  // epoch]). A sampler must opt in by overriding: this default accepts only 0, so that a
  // custom sampler never silently trains a resumed epoch from its beginning.
  virtual void set_start(int64_t consumed);
  int64_t start() const { return start_; }
  // The positions of *this process's* list that the start skips: start() for a sampler that
  // serves one process, start() / num_replicas for DistributedSampler. The DataLoader numbers
  // the first batch after a start local_start() / batch_size, as an uninterrupted pass would.
  virtual int64_t local_start() const { return start_; }
  // The epoch's global order, in words ("RandomSampler's order of 256 samples, seed 5"):
  // samplers whose positions mean the same samples in every epoch say the same, whatever
  // their world size. The TrainLoop records it in its checkpoints, to say when an epoch resumed
  // part-way goes on in another order. "" for an order this cannot name (a custom sampler).
  virtual std::string global_order() const { return ""; }

 protected:
  // What an overriding set_start calls: checks `consumed` >= 0 and records it.
  void record_start(int64_t consumed);

 private:
  int64_t epoch_ = 0;
  int64_t start_ = 0;
};

// 0, 1, ..., n - 1 (from start() on).
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return std::max<int64_t>(0, n_ - start()); }
  std::vector<int64_t> indices() const override;
  void set_start(int64_t consumed) override { record_start(consumed); }
  std::string global_order() const override;

 private:
  int64_t n_;
};

// A permutation of 0 .. n - 1 drawn with randperm from a generator seeded
// derive_seed(seed, epoch). Without replacement (PyTorch's replacement / num_samples
// options are not offered). After set_start(C): the same permutation without its first C.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0);
  int64_t size() const override { return std::max<int64_t>(0, n_ - start()); }
  std::vector<int64_t> indices() const override;
  void set_start(int64_t consumed) override { record_start(consumed); }
  std::string global_order() const override;

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
  // Reaches the wrapped sampler: the batches are those of what is left.
  void set_start(int64_t consumed) { sampler_->set_start(consumed); }
  int64_t start() const { return sampler_->start(); }
  // The index of the first batch in an uninterrupted pass: local_start() / batch_size.
  int64_t first_batch() const { return sampler_->local_start() / batch_size_; }

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
// After set_start(C) the same rule applies to the remainder G[C:] of n - C samples, padded
// from G[0] on (Note [Starting part-way into an epoch]): num_samples and total_size are the
// remainder's.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  int64_t size() const override { return num_samples(); }
  std::vector<int64_t> indices() const override;
  void set_start(int64_t consumed) override { record_start(consumed); }
  int64_t local_start() const override { return start() / num_replicas_; }
  // Without shuffle, SequentialSampler's.
  std::string global_order() const override;

  int64_t num_samples() const;
  int64_t total_size() const { return num_samples() * num_replicas_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  bool drop_last() const { return drop_last_; }

 private:
  // The samples left this epoch: n - start, at least 0.
  int64_t remaining() const { return std::max<int64_t>(0, dataset_size_ - start()); }

  int64_t dataset_size_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
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
// (generator seeded seed + epoch). Evaluation runs whole: set_start accepts only 0.
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
