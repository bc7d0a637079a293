// BatchNorm2d: parameters and buffers under PyTorch's names, the train / eval choice of
// statistics, and the num_batches_tracked counter; the math is weft::batch_norm.
#include "nn/batch_norm.h"

#include <sstream>

#include "core/autograd.h"
#include "kernels/batch_norm.h"
#include "kernels/elementwise.h"

namespace weft::nn {

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats, const TensorOptions& options)
    : BatchNorm2d("BatchNorm2d", num_features, eps, momentum, affine, track_running_stats, options) {}

BatchNorm2d::BatchNorm2d(std::string type_name, int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats, const TensorOptions& options)
    : Cloneable(std::move(type_name)),
      num_features_(num_features),
      eps_(eps),
      momentum_(momentum),
      affine_(affine),
      track_running_stats_(track_running_stats) {
  WEFT_CHECK(num_features > 0, this->type_name(), ": num_features must be positive, got ", num_features);
  WEFT_CHECK(eps > 0, this->type_name(), ": eps must be positive, got ", eps);
  WEFT_CHECK(is_floating(options.dtype), this->type_name(), ": parameters need a floating dtype, got ", options.dtype);
  const TensorOptions opts(options.dtype, options.device);
  if (affine) {
    register_parameter("weight", ones({num_features}, opts));
    register_parameter("bias", zeros({num_features}, opts));
  }
  if (track_running_stats) {
    register_buffer("running_mean", zeros({num_features}, opts));
    register_buffer("running_var", ones({num_features}, opts));
    register_buffer("num_batches_tracked", zeros({}, TensorOptions(DType::Int64, options.device)));
  }
}

BatchNorm2d::BatchNorm2d(const BatchNorm2d& from, std::string type_name)
    : Cloneable(from, std::move(type_name)),
      num_features_(from.num_features_),
      eps_(from.eps_),
      momentum_(from.momentum_),
      affine_(from.affine_),
      track_running_stats_(from.track_running_stats_) {}

void BatchNorm2d::reset_running_stats() {
  if (!track_running_stats_) return;
  NoGradGuard no_grad;
  zero_(buffer("running_mean"));
  fill_(buffer("running_var"), 1.0);
  zero_(buffer("num_batches_tracked"));
}

void BatchNorm2d::check_input(const Tensor& input) const {
  WEFT_CHECK(input.defined() && input.dim() == 4, type_name(), ": expected a 4-d input [N, C, H, W], got ",
             input.defined() ? input.shape().str() : "an undefined tensor");
  WEFT_CHECK(input.size(1) == num_features_, type_name(), ": expected ", num_features_,
             " channels, got input of shape ", input.shape());
}

double BatchNorm2d::count_batch() {
  if (!is_training()) return momentum_.value_or(0.0);
  const Tensor& tracked = buffer("num_batches_tracked");
  {
    NoGradGuard no_grad;
    add_(tracked, 1.0);
  }
  return momentum_ ? *momentum_ : 1.0 / tracked.item();
}

Tensor BatchNorm2d::forward(const Tensor& input) {
  check_input(input);
  const Tensor weight = affine_ ? param("weight") : Tensor();
  const Tensor bias = affine_ ? param("bias") : Tensor();
  if (!track_running_stats_) return batch_norm(input, Tensor(), Tensor(), weight, bias, true, 0.0, eps_);
  const double factor = count_batch();
  return batch_norm(input, buffer("running_mean"), buffer("running_var"), weight, bias, is_training(), factor, eps_);
}

std::string BatchNorm2d::extra_repr() const {
  std::ostringstream out;
  out << num_features_ << ", eps=" << eps_ << ", momentum=";
  if (momentum_) {
    out << *momentum_;
  } else {
    out << "None";
  }
  out << ", affine=" << (affine_ ? "true" : "false")
      << ", track_running_stats=" << (track_running_stats_ ? "true" : "false");
  return out.str();
}

}  // namespace weft::nn
