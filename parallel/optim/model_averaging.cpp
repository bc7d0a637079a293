// Averaging the replicas' parameters; see model_averaging.h.
#include "parallel/optim/model_averaging.h"

#include "core/error.h"
#include "parallel/process_group/distributed.h"

namespace weft::parallel {

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
