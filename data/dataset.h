// Datasets: what a DataLoader reads samples from (PyTorch's torch.utils.data.Dataset).
//
// A map-style dataset: size() samples, get(i) one (data, target) pair. The loader asks
// for whole batches through get_batch(), whose default stacks get() results; datasets
// whose samples are rows of one tensor (TensorDataset, FashionMNIST) override it with a
// single index_select, which is what makes loading cheap next to the model.
//
// get() and get_batch() are const and are called concurrently from DataLoader worker
// threads: a dataset must not mutate shared state in them. A dataset that draws random
// numbers (augmentation) takes them from data::batch_generator() (dataloader.h), which is
// seeded per batch so that results do not depend on the number of workers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace weft::data {

// One sample. target may be undefined for an unlabelled dataset.
struct Example {
  Tensor data;
  Tensor target;
};

// Samples joined along a new leading dim: data [B, ...], target [B, ...].
struct Batch {
  Tensor data;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // Default: stack(get(i) for i in indices) for data and for target (the targets must
  // be all defined or all undefined). Fails on an empty index list or an index out of
  // range.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;

 protected:
  // Throws "<who>: index I is out of range for a dataset of N samples" unless 0 <= index < size().
  void check_index(int64_t index, const char* who) const;
};

// Rows of two tensors: sample i is (data[i], targets[i]). get() returns views of the rows;
// get_batch() copies the selected rows with one index_select per tensor.
class TensorDataset : public Dataset {
 public:
  // data and targets need at least one dim and the same first dim (targets may be
  // undefined for an unlabelled dataset). The tensors are detached: a dataset holds values,
  // not a graph.
  TensorDataset(Tensor data, Tensor targets);

  int64_t size() const override { return data_.size(0); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
};

// Fashion-MNIST (Zalando): 28x28 grey images of 10 clothing classes, 60000 for training,
// 10000 for test, in the IDX format. The Debian package dataset-fashion-mnist installs them
// gzip'd under /usr/share/datasets/fashion-mnist; plain (unpacked) files are read too,
// preferred when both are present.
//
// data: float32 [N, 1, 28, 28], the byte values scaled to [0, 1] (v / 255) and, when
// normalize is true, then normalised with the training set's mean 0.2860 and std 0.3530
// ((x - mean) / std, computed in float32 in that order, as torchvision's
// ToTensor() + Normalize((0.2860,), (0.3530,)) does). targets: int64 [N] in [0, 9].
inline constexpr const char* kFashionMnistDefaultRoot = "/usr/share/datasets/fashion-mnist";
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

class FashionMNIST : public TensorDataset {
 public:
  explicit FashionMNIST(const std::string& root = kFashionMnistDefaultRoot, bool train = true,
                        bool normalize = true);

  // "T-shirt/top", "Trouser", ... in label order.
  static const std::vector<std::string>& classes();

 private:
  explicit FashionMNIST(std::pair<Tensor, Tensor> loaded);
};

}  // namespace weft::data
