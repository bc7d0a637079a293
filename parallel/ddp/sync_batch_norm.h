// SyncBatchNorm: batch normalisation whose batch statistics are those of the whole job's
// batch, not of one rank's share (PyTorch's torch.nn.SyncBatchNorm).
//
// Under DistributedDataParallel each rank normalises its own b samples with BatchNorm2d, so
// R ranks train differently from one process on the R * b samples (the statistics of a
// smaller batch, and no gradient through the other ranks' samples). SyncBatchNorm computes
// the mean and variance over every rank's samples of the step and back-propagates through
// them across ranks, so a DDP job in training mode equals one process on the whole batch
// (tests/parallel/ddp/test_ddp.cpp checks it to 1e-9 in float64, running statistics included).
//
//   auto model = std::make_shared<nn::ResNet>(...);
//   parallel::SyncBatchNorm::convert(model);  // every BatchNorm2d, in place, weights kept
//   parallel::DistributedDataParallel ddp(model);
//
// Note [Synchronised statistics]: in training mode, with a group of more than one rank,
// forward runs one all-reduce over the group. Each rank computes, on its own samples, its
// count n_r of values per channel, each channel's sum and its sum of squared deviations from
// the rank's own channel mean (M2_r, two passes, so float32 keeps the single-device kernel's
// precision); it writes them as its row of a zero [ranks, 1 + 2C] table, and the all-reduce
// (sum) of the tables gives every rank all the rows: an all-gather. From them, on every
// rank: mean = sum / N, and var = (sum_r M2_r + n_r (mean_r - mean)^2) / N (biased, for
// normalising; Chan et al.'s combination, which does not cancel as E[x^2] - E[x]^2 would).
// Then y = (x - mean) / sqrt(var + eps) * weight + bias, and the running statistics are
// updated as BatchNorm2d's (with the unbiased var * N / (N - 1)). The all-reduce is a node
// of the graph whose backward all-reduces the incoming gradient: the sum over the ranks'
// losses' gradients with respect to the shared table, which is what one process on the
// whole batch computes. DDP then divides every parameter's gradient by the world size, as
// for any layer. One collective forward and one backward per layer, as PyTorch's. The
// statistics stay on the device: N is read back to the host (to refuse a single value per
// channel) only on a rank with at most one value per channel of its own, the only case
// where the job's N can be 1 (PyTorch reads its count back at every forward).
//
// Ranks may hold different numbers of samples, none included. Every rank must run the same
// SyncBatchNorm layers in the same order, forward and backward (as DDP's collectives
// require anyway). Evaluation mode, and training with a group of one rank or no group at
// all, is BatchNorm2d exactly, with no communication. The collectives are issued from the
// calling thread: one replica per process, not under DataParallel (as in PyTorch).
//
// Where weft differs from PyTorch: like weft's BatchNorm2d it takes 4-d inputs (PyTorch's
// converts BatchNorm1d and 3d too); CPU tensors are synchronised too (through Gloo), so DDP
// jobs of CPU ranks can use it; the composite form above runs a few more elementwise passes
// than PyTorch's fused CUDA kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "nn/batch_norm.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// A BatchNorm2d (the same arguments, parameters and buffers, so state dicts load into
// either, and code that asks for a BatchNorm2d child still finds one) with the forward of
// Note [Synchronised statistics].
class SyncBatchNorm : public nn::BatchNorm2d {
 public:
  // group: the ranks to synchronise over; null: the default group, looked up at each
  // training forward (PyTorch's WORLD).
  explicit SyncBatchNorm(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                         bool affine = true, bool track_running_stats = true, const TensorOptions& options = {},
                         std::shared_ptr<ProcessGroup> group = nullptr);

  Tensor forward(const Tensor& input) override;

  // PyTorch's SyncBatchNorm.convert_sync_batchnorm: every nn::BatchNorm2d in `module`'s tree
  // (itself included) becomes a SyncBatchNorm with the same configuration, training mode and
  // tensors (the same parameter handles: an optimizer made before still holds them), put in
  // its parent's slot with replace_child. Returns `module`, or its replacement when `module`
  // is itself a BatchNorm2d.
  static std::shared_ptr<nn::Module> convert(std::shared_ptr<nn::Module> module,
                                             std::shared_ptr<ProcessGroup> group = nullptr);
  // How many BatchNorm2d layers `module`'s tree holds, SyncBatchNorms included (0: no
  // statistics to synchronise).
  static size_t batch_norm_layers(const nn::Module& module);

 protected:
  std::shared_ptr<nn::Module> shallow_copy() const override { return std::make_shared<SyncBatchNorm>(*this); }

 private:
  // A SyncBatchNorm holding `from`'s tensors (convert).
  SyncBatchNorm(const nn::BatchNorm2d& from, std::shared_ptr<ProcessGroup> group);
  // The group a training forward synchronises over; null when there is no one to sync with
  // (no group given and no default group, or a group of one rank).
  std::shared_ptr<ProcessGroup> sync_group() const;

  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace weft::parallel
