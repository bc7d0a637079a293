// Model averaging: the replicas of a data-parallel job made equal again by averaging their
// parameters (PyTorch's torch.distributed.algorithms.model_averaging). With local SGD
// (parallel/ddp/post_localsgd_hook.h) the ranks step on gradients that are not averaged over
// every rank, so their parameters drift apart; an averager, called after each optimizer step
// (or through PostLocalSGDOptimizer, parallel/optim/post_localsgd_optimizer.h), all-reduces them
// every few steps, with average_parameters (parallel/process_group/coalesced_collectives.h).
//
//   PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/100);
//   ... optimizer.step(); averager.average_parameters(model->parameters());
//
// Each call counts one step. PeriodicModelAverager averages over its group at steps
// warmup_steps, warmup_steps + period, warmup_steps + 2 period, ...; before warmup_steps it
// does nothing (the post-local SGD hook's warm-up averages the gradients then). The
// HierarchicalModelAverager averages at several levels: given {2: 2 ranks, 8: 4 ranks,
// 32: all of them}, every 32 steps over the whole job, else every 8 within groups of 4, else
// every 2 within pairs (Lin et al.'s hierarchical local SGD: the cheap links more often).
//
// Only parameters are averaged, not buffers, and not the optimizers' state (PyTorch's
// choice): under DDP rank 0's buffers reach every replica before each forward anyway.
// Averaging inside a join (parallel/process_group/join.h) is an error: a rank that ran out cannot shadow it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/process_group/coalesced_collectives.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// What PostLocalSGDOptimizer drives: called once per optimizer step, it decides whether
// this step averages. step() counts the calls so far (saved with the optimizer's state).
class ModelAverager {
 public:
  virtual ~ModelAverager() = default;
  virtual void average_parameters(const std::vector<Tensor>& params) = 0;
  int64_t step() const { return step_; }
  void set_step(int64_t step);  // resume: the count the state was saved at

 protected:
  int64_t step_ = 0;
};

class PeriodicModelAverager final : public ModelAverager {
 public:
  // period >= 1 and warmup_steps >= 0 (else an error naming them). `group`: unset for the
  // default group; null (new_group's answer on a rank outside the group) makes an averager
  // that only counts, as PyTorch's skips the ranks outside its group.
  PeriodicModelAverager(int64_t period, int64_t warmup_steps = 0,
                        std::optional<std::shared_ptr<ProcessGroup>> group = std::nullopt);
  void average_parameters(const std::vector<Tensor>& params) override;
  // Whether a call at `step` averages.
  bool averages_at(int64_t step) const;

 private:
  int64_t period_, warmup_steps_;
  std::shared_ptr<ProcessGroup> group_;  // null on a rank outside the group
};

class HierarchicalModelAverager final : public ModelAverager {
 public:
  // (period, group size) pairs, periods increasing, over the default group: each group
  // size divides the world (its groups are new_subgroups(size)), and the last is the whole
  // world. A step at or after warmup_steps averages within the groups of the largest
  // period that divides it, if any. Makes the sub-groups: every rank constructs it at the
  // same point. As in PyTorch, the levels need not nest (each size dividing the next), though
  // a hierarchy usually does.
  HierarchicalModelAverager(const std::vector<std::pair<int64_t, int>>& period_group_sizes, int64_t warmup_steps = 0);
  void average_parameters(const std::vector<Tensor>& params) override;
  // The size of the groups a call at `step` averages within; 0 where it does not average.
  int group_size_at(int64_t step) const;

 private:
  struct Level {
    int64_t period;
    std::shared_ptr<ProcessGroup> group;
  };
  const Level* level_at(int64_t step) const;
  std::vector<Level> levels_;  // periods increasing
  int64_t warmup_steps_;
};

}  // namespace weft::parallel
