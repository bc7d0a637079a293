// BatchNorm2d (torch.nn.BatchNorm2d): per-channel normalisation of [N, C, H, W] inputs,
// with the running statistics as buffers so that they travel with state_dict, to() and
// clone().
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nn/module.h"

namespace weft::nn {

// Parameters (affine): "weight" = 1, "bias" = 0, both [num_features]. Buffers
// (track_running_stats): "running_mean" = 0, "running_var" = 1 (of the parameters'
// dtype) and "num_batches_tracked" (int64, 0-d, 0). These are PyTorch's names, so
// state dicts interoperate.
//
// forward, as PyTorch's:
// - training with track_running_stats: normalises with the batch statistics, adds 1 to
//   num_batches_tracked and updates the running stats with factor `momentum`, or with
//   1 / num_batches_tracked (a cumulative average) when momentum is nullopt;
// - evaluation with track_running_stats: normalises with the running stats;
// - without track_running_stats: always the batch statistics, nothing stored.
class BatchNorm2d : public Cloneable<BatchNorm2d> {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true, const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  std::optional<double> momentum() const { return momentum_; }
  bool affine() const { return affine_; }
  bool track_running_stats() const { return track_running_stats_; }

  // Running stats back to mean 0, var 1 and num_batches_tracked to 0 (PyTorch's
  // reset_running_stats).
  void reset_running_stats();

 protected:
  // For a layer that is a BatchNorm2d with its own forward (parallel::SyncBatchNorm).
  BatchNorm2d(std::string type_name, int64_t num_features, double eps, std::optional<double> momentum, bool affine,
              bool track_running_stats, const TensorOptions& options);
  // A shallow copy of `from` (its very tensors) under another type name.
  BatchNorm2d(const BatchNorm2d& from, std::string type_name);
  // Refuses an input that is not [N, num_features, H, W].
  void check_input(const Tensor& input) const;
  // With running stats: in training, counts the batch in num_batches_tracked; returns the
  // running statistics' update factor (momentum, or 1 / num_batches_tracked without one).
  double count_batch();

 private:
  int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  bool affine_;
  bool track_running_stats_;
};

}  // namespace weft::nn
