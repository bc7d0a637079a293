// Loss modules: CrossEntropyLoss, NLLLoss, MSELoss (torch.nn's names and options).
//
// They hold only options (a class weight at most), so they are plain callables, not
// Modules: `CrossEntropyLoss criterion; Tensor loss = criterion(logits, target);`. The
// options are the functional versions' (kernels/loss.h), in PyTorch's order, and can be
// set by name: CrossEntropyLoss({.reduction = Reduction::Sum, .label_smoothing = 0.1}).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/loss.h"

namespace weft::nn {

struct CrossEntropyLossOptions {
  Tensor weight;  // [C] class weights of the logits' dtype and device, or undefined
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  double label_smoothing = 0.0;
};

// cross_entropy(input logits [N, C, ...], int64 class-index target [N, ...]).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions options = {});
  Tensor operator()(const Tensor& input, const Tensor& target) const;
  const CrossEntropyLossOptions& options() const { return options_; }
  // Moves the class weight (if any) to `device`, next to the model's outputs.
  void to(Device device);

 private:
  CrossEntropyLossOptions options_;
};

struct NLLLossOptions {
  Tensor weight;  // [C] class weights, or undefined
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
};

// nll_loss(input log-probabilities [N, C, ...], int64 class-index target [N, ...]).
class NLLLoss {
 public:
  explicit NLLLoss(NLLLossOptions options = {});
  Tensor operator()(const Tensor& input, const Tensor& target) const;
  const NLLLossOptions& options() const { return options_; }
  void to(Device device);

 private:
  NLLLossOptions options_;
};

// mse_loss(input, target) of one shape.
class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const;
  Reduction reduction() const { return reduction_; }

 private:
  Reduction reduction_;
};

}  // namespace weft::nn
