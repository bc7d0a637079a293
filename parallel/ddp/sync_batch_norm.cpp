// SyncBatchNorm: the statistics of Note [Synchronised statistics] as differentiable ops
// around one all-reduce, recorded as a graph node whose backward all-reduces too.
#include "parallel/ddp/sync_batch_norm.h"

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/shape_ops.h"
#include "parallel/process_group/distributed.h"

namespace weft::parallel {

namespace {

// The sum of `t` over the group's ranks, differentiable: d(sum)/d(t on rank k) is the sum of
// every rank's incoming gradient (each rank's loss depends on the same sum). Every rank
// reaches this node's backward in the same order (the same graph), so the backward
// all-reduces line up as the forward ones do.
Tensor all_reduce_sum(const Tensor& t, const std::shared_ptr<ProcessGroup>& group) {
  Tensor out = t.detach().clone();
  group->all_reduce(out, ReduceOp::Sum)->wait();
  if (any_requires_grad(t)) {
    set_history(out, make_node(
                         "SyncBatchNormAllReduceBackward",
                         [group, shape = t.shape(), options = TensorOptions(t.dtype(), t.device())](
                             const GradList& grads) -> GradList {
                           // A fresh buffer: the incoming gradient may be shared or a view, and
                           // a rank whose loss did not reach here still has to take part.
                           Tensor g = grads[0].defined() ? grads[0].clone() : zeros(shape, options);
                           group->all_reduce(g, ReduceOp::Sum)->wait();
                           return {g};
                         },
                         t));
  }
  return out;
}

// Dims reduced for per-channel statistics of [N, C, H, W]: all but 1.
const std::vector<int64_t> kStatDims = {0, 2, 3};

}  // namespace

SyncBatchNorm::SyncBatchNorm(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                             bool track_running_stats, const TensorOptions& options,
                             std::shared_ptr<ProcessGroup> group)
    : BatchNorm2d("SyncBatchNorm", num_features, eps, momentum, affine, track_running_stats, options),
      group_(std::move(group)) {}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNorm2d& from, std::shared_ptr<ProcessGroup> group)
    : BatchNorm2d(from, "SyncBatchNorm"), group_(std::move(group)) {}

std::shared_ptr<ProcessGroup> SyncBatchNorm::sync_group() const {
  std::shared_ptr<ProcessGroup> group = group_;
  if (!group && is_initialized()) group = default_group_ptr();
  return group && group->size() > 1 ? group : nullptr;
}

Tensor SyncBatchNorm::forward(const Tensor& input) {
  std::shared_ptr<ProcessGroup> group = is_training() ? sync_group() : nullptr;
  if (!group) return BatchNorm2d::forward(input);
  check_input(input);
  const double factor = track_running_stats() ? count_batch() : 0.0;
  const int64_t channels = num_features();
  const Shape per_channel{1, channels, 1, 1};
  const TensorOptions options(input.dtype(), input.device());

  // This rank's count, channel sums and squared deviations from its own channel means (0
  // for a rank without samples), as row `rank` of an otherwise zero [ranks, 1 + 2C] table:
  // summed over the ranks, it holds every rank's row.
  const int64_t width = 1 + 2 * channels;
  const double local_count = static_cast<double>(input.numel() / channels);
  Tensor local_sum = sum(input, kStatDims);
  Tensor local_centered = sub(input, div(local_sum, std::max(local_count, 1.0)).view(per_channel));
  Tensor row = cat({full({1}, local_count, options), local_sum, sum(mul(local_centered, local_centered), kStatDims)});
  std::vector<Tensor> rows;
  if (group->rank() > 0) rows.push_back(zeros({group->rank(), width}, options));
  rows.push_back(row.view({1, width}));
  if (group->rank() + 1 < group->size()) rows.push_back(zeros({group->size() - group->rank() - 1, width}, options));
  Tensor table = all_reduce_sum(cat(rows, 0), group);
  Tensor counts = table.narrow(1, 0, 1).detach(), sums = table.narrow(1, 1, channels);
  Tensor squares = table.narrow(1, 1 + channels, channels);
  Tensor total = sum(counts);  // N, on the device: read back only when it could be 1
  if (local_count <= 1) {
    const double count = total.item();
    WEFT_CHECK(count > 1, "SyncBatchNorm: expected more than 1 value per channel when training, got ", count,
               " over the ", group->size(), " ranks (this rank's input has shape ", input.shape(), ")");
  }

  // The job's mean, and its variance by Chan et al.'s combination of the ranks' parts:
  // M2 = sum_r (M2_r + n_r (mean_r - mean)^2), stable where E[x^2] - E[x]^2 would cancel.
  Tensor mean = div(sum(sums, {0}), total);
  Tensor deviation = sub(div(sums, clamp(counts, 1.0, std::nullopt)), mean.view({1, channels}));
  Tensor var = div(add(sum(squares, {0}), sum(mul(counts, mul(deviation, deviation)), {0})), total);
  Tensor centered = sub(input, mean.view(per_channel));

  Tensor out = mul(centered, pow(add(var, eps()), -0.5).view(per_channel));
  if (affine()) out = add(mul(out, param("weight").view(per_channel)), param("bias").view(per_channel));
  if (track_running_stats()) {
    NoGradGuard no_grad;
    const Tensor& running_mean = buffer("running_mean");
    const Tensor& running_var = buffer("running_var");
    mul_(running_mean, 1.0 - factor);
    add_(running_mean, mul(mean.detach(), factor));
    mul_(running_var, 1.0 - factor);
    add_(running_var, mul(var.detach(), mul(div(total, sub(total, 1.0)), factor)));
  }
  return out;
}

std::shared_ptr<nn::Module> SyncBatchNorm::convert(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group) {
  WEFT_CHECK(module != nullptr, "SyncBatchNorm::convert: the module is null");
  auto* batch_norm = dynamic_cast<nn::BatchNorm2d*>(module.get());
  if (batch_norm != nullptr && dynamic_cast<SyncBatchNorm*>(module.get()) == nullptr)
    return std::shared_ptr<SyncBatchNorm>(new SyncBatchNorm(*batch_norm, group));
  // Copied first: replace_child changes the list being walked.
  const auto children = module->named_children();
  for (const auto& [name, child] : children) {
    std::shared_ptr<nn::Module> converted = convert(child, group);
    if (converted != child) module->replace_child(name, std::move(converted));
  }
  return module;
}

size_t SyncBatchNorm::batch_norm_layers(const nn::Module& module) {
  size_t count = 0;
  for (const auto& [name, m] : module.named_modules())
    if (dynamic_cast<const nn::BatchNorm2d*>(m) != nullptr) ++count;
  return count;
}

}  // namespace weft::parallel
