// Post-local SGD: DDP's gradients all-reduced across every rank for a warm-up, then only
// within small groups (or not at all), the replicas averaged every few steps instead (Lin et
// al., "Don't use large mini-batches, use local SGD", ICLR 2020; PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook).
//
//   auto state = std::make_shared<parallel::PostLocalSGDState>(
//       nullptr, parallel::PostLocalSGDOptions{.start_iteration = 100});
//   ddp->register_comm_hook(parallel::post_localsgd_hook(state));
//   parallel::PostLocalSGDOptimizer optimizer(
//       std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.01, 0.9}),
//       std::make_shared<parallel::PeriodicModelAverager>(4, /*warmup_steps=*/100));
//
// For the first start_iteration backward passes every bucket is averaged over DDP's group,
// as without a hook: the replicas stay equal. From then on each bucket is averaged over
// `subgroup` only (the ranks of one machine, by default: cheap links), or, with
// post_local_gradient_allreduce off, left as this rank's own gradient: no communication in
// backward. The replicas then drift apart, and a model averager
// (parallel/model_averaging.h) brings them back together after every `period` optimizer
// steps; its warm-up must equal start_iteration, so that averaging starts when the
// gradients stop being averaged globally. Without an averager the replicas never meet again.
//
// What the replicas do not share once local: each rank's optimizer state (momentum, Adam's
// moments) follows its own gradients and is never averaged, as in PyTorch; BatchNorm's
// running statistics still come from rank 0 before each forward (DDP's broadcast_buffers).
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/comm_hooks.h"

namespace weft::parallel {

struct PostLocalSGDOptions {
  int64_t start_iteration = 0;                // PyTorch's start_localSGD_iter: global all-reduces before it
  bool post_local_gradient_allreduce = true;  // after it: average within the subgroup (true) or not at all
};

// What the hook keeps (every rank holds its own).
class PostLocalSGDState {
 public:
  // `subgroup`: the group this rank's buckets are averaged over from start_iteration on.
  // Null: one per machine, made here by new_subgroups() (parallel/distributed.h), so every
  // rank of the default group must then construct its state at the same point; not made
  // when post_local_gradient_allreduce is off. A negative start_iteration is an error.
  PostLocalSGDState(std::shared_ptr<ProcessGroup> subgroup, PostLocalSGDOptions options = {});

  const PostLocalSGDOptions& options() const { return options_; }
  const std::shared_ptr<ProcessGroup>& subgroup() const { return subgroup_; }
  int64_t iteration() const { return iteration_; }  // backward passes seen
  bool local() const { return iteration_ >= options_.start_iteration; }  // the next backward's buckets stay local

 private:
  friend CommHook post_localsgd_hook(std::shared_ptr<PostLocalSGDState> state);
  std::shared_ptr<ProcessGroup> subgroup_;
  PostLocalSGDOptions options_;
  int64_t iteration_ = 0;
};

CommHook post_localsgd_hook(std::shared_ptr<PostLocalSGDState> state);

}  // namespace weft::parallel
