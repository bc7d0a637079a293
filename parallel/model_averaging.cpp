// Averaging the replicas' parameters; see model_averaging.h.
#include "parallel/model_averaging.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "parallel/collective_support.h"
#include "parallel/distributed.h"
#include "parallel/join.h"

namespace weft::parallel {

void average_parameters(const std::vector<Tensor>& params, ProcessGroup& group) {
  if (params.empty() || group.size() == 1) return;  // a group of one is its own average
  WEFT_CHECK(!join_running(), "average_parameters: a model average cannot run inside a join (a rank that ran out of ",
             "inputs cannot shadow it): average after the join returns");
  NoGradGuard no_grad;
  const Device device = params[0].device();
  std::vector<DType> dtypes;
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_CHECK(params[i].defined(), "average_parameters: parameter ", i, " is undefined");
    WEFT_CHECK(params[i].device() == device, "average_parameters: parameter ", i, " is on ", params[i].device().str(),
               " but parameter 0 on ", device.str(), " (the parameters must share one device)");
    if (std::find(dtypes.begin(), dtypes.end(), params[i].dtype()) == dtypes.end()) dtypes.push_back(params[i].dtype());
  }
  for (DType dtype : dtypes) {
    std::vector<Tensor> same;
    for (const Tensor& p : params)
      if (p.dtype() == dtype) same.push_back(p);
    Tensor flat = detail::flatten(same);
    group.all_reduce(flat, ReduceOp::Avg)->wait();
    detail::unflatten_into(flat, same);
  }
}

void average_gradients(const std::vector<Tensor>& params, ProcessGroup& group) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_CHECK(params[i].grad().defined(), "average_gradients: parameter ", i, " (", params[i].shape().str(),
               ") has no gradient; every rank must average the same gradients, after the backward");
    grads.push_back(params[i].grad());
  }
  average_parameters(grads, group);
}

void broadcast_tensors(const std::vector<Tensor>& tensors, ProcessGroup& group, int root) {
  if (group.size() == 1 || tensors.empty()) return;
  NoGradGuard no_grad;
  // One flat broadcast per (dtype, device): few messages instead of one per tensor.
  std::vector<bool> done(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (done[i]) continue;
    std::vector<Tensor> same;
    for (size_t j = i; j < tensors.size(); ++j)
      if (!done[j] && tensors[j].dtype() == tensors[i].dtype() && tensors[j].device() == tensors[i].device()) {
        same.push_back(tensors[j]);
        done[j] = true;
      }
    Tensor flat = detail::flatten(same);
    group.broadcast(flat, root)->wait();
    detail::unflatten_into(flat, same);
  }
}

void ModelAverager::set_step(int64_t step) {
  WEFT_CHECK(step >= 0, "ModelAverager::set_step: the step count must be >= 0, got ", step);
  step_ = step;
}

PeriodicModelAverager::PeriodicModelAverager(int64_t period, int64_t warmup_steps,
                                             std::optional<std::shared_ptr<ProcessGroup>> group)
    : period_(period), warmup_steps_(warmup_steps), group_(group ? std::move(*group) : default_group_ptr()) {
  WEFT_CHECK(period_ >= 1, "PeriodicModelAverager: period must be >= 1, got ", period_);
  WEFT_CHECK(warmup_steps_ >= 0, "PeriodicModelAverager: warmup_steps must be >= 0, got ", warmup_steps_);
}

bool PeriodicModelAverager::averages_at(int64_t step) const {
  return step >= warmup_steps_ && (step - warmup_steps_) % period_ == 0;
}

void PeriodicModelAverager::average_parameters(const std::vector<Tensor>& params) {
  if (group_ && averages_at(step_)) parallel::average_parameters(params, *group_);
  ++step_;
}

HierarchicalModelAverager::HierarchicalModelAverager(const std::vector<std::pair<int64_t, int>>& period_group_sizes,
                                                     int64_t warmup_steps)
    : warmup_steps_(warmup_steps) {
  constexpr const char* kWho = "HierarchicalModelAverager";
  WEFT_CHECK(!period_group_sizes.empty(), kWho, ": needs at least one (period, group size)");
  WEFT_CHECK(warmup_steps_ >= 0, kWho, ": warmup_steps must be >= 0, got ", warmup_steps_);
  const int world = get_world_size();
  for (size_t i = 0; i < period_group_sizes.size(); ++i) {
    const auto [period, size] = period_group_sizes[i];
    WEFT_CHECK(period >= 1, kWho, ": period ", period, " must be >= 1");
    WEFT_CHECK(i == 0 || period > period_group_sizes[i - 1].first, kWho, ": the periods must increase, but ", period,
               " follows ", period_group_sizes[i - 1].first);
    WEFT_CHECK(size >= 1 && world % size == 0, kWho, ": a group size of ", size, " (period ", period,
               ") does not divide the ", world, " ranks into equal groups");
  }
  WEFT_CHECK(period_group_sizes.back().second == world, kWho, ": the last group size (of the largest period, ",
             period_group_sizes.back().first, ") must be the whole world, ", world, ", not ",
             period_group_sizes.back().second);
  for (const auto& [period, size] : period_group_sizes)
    levels_.push_back({period, size == world ? default_group_ptr() : new_subgroups(size)});
}

const HierarchicalModelAverager::Level* HierarchicalModelAverager::level_at(int64_t step) const {
  if (step < warmup_steps_) return nullptr;
  for (auto level = levels_.rbegin(); level != levels_.rend(); ++level)
    if (step % level->period == 0) return &*level;
  return nullptr;
}

int HierarchicalModelAverager::group_size_at(int64_t step) const {
  const Level* level = level_at(step);
  return level ? level->group->size() : 0;
}

void HierarchicalModelAverager::average_parameters(const std::vector<Tensor>& params) {
  if (const Level* level = level_at(step_)) parallel::average_parameters(params, *level->group);
  ++step_;
}

}  // namespace weft::parallel
