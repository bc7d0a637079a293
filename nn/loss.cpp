// Loss modules: option checks at construction, then the functional losses.
#include "nn/loss.h"

#include <utility>

namespace weft::nn {

namespace {

void check_weight(const char* loss, const Tensor& weight) {
  if (!weight.defined()) return;
  WEFT_CHECK(weight.dim() == 1, loss, ": weight must be a 1-d tensor of one value per class, got shape ",
             weight.shape());
  WEFT_CHECK(!weight.requires_grad(), loss, ": a class weight is not differentiable; pass weight.detach()");
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyLossOptions options) : options_(std::move(options)) {
  check_weight("CrossEntropyLoss", options_.weight);
  WEFT_CHECK(options_.label_smoothing >= 0.0 && options_.label_smoothing <= 1.0,
             "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", options_.label_smoothing);
}

Tensor CrossEntropyLoss::operator()(const Tensor& input, const Tensor& target) const {
  return cross_entropy(input, target, options_.reduction, options_.ignore_index, options_.weight,
                       options_.label_smoothing);
}

void CrossEntropyLoss::to(Device device) {
  if (options_.weight.defined()) options_.weight = options_.weight.to(device);
}

NLLLoss::NLLLoss(NLLLossOptions options) : options_(std::move(options)) { check_weight("NLLLoss", options_.weight); }

Tensor NLLLoss::operator()(const Tensor& input, const Tensor& target) const {
  return nll_loss(input, target, options_.reduction, options_.ignore_index, options_.weight);
}

void NLLLoss::to(Device device) {
  if (options_.weight.defined()) options_.weight = options_.weight.to(device);
}

Tensor MSELoss::operator()(const Tensor& input, const Tensor& target) const {
  return mse_loss(input, target, reduction_);
}

}  // namespace weft::nn
