// Post-local SGD: DDP's gradients all-reduced across every rank for a warm-up, then only
// within small groups (or not at all), the replicas averaged every few steps instead (Lin et
// al., "Don't use large mini-batches, use local SGD", ICLR 2020; PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook).
//
//   auto state = std::make_shared<parallel::PostLocalSGDState>(
//       parallel::PostLocalSGDOptions{.start_iteration = 100});
//   ddp->register_comm_hook(parallel::post_localsgd_hook(state));
//   parallel::PostLocalSGDOptimizer optimizer(
//       std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{0.01, 0.9}),
//       std::make_shared<parallel::PeriodicModelAverager>(4, /*warmup_steps=*/100));
//
// For the first start_iteration backward passes every bucket is averaged over DDP's group,
// as without a hook: the replicas stay equal. From then on each bucket is averaged over
// `subgroup` only (the ranks of one machine, by default: cheap links), or, with
// post_local_gradient_allreduce off, left as this rank's own gradient: no all-reduce of
// gradients in backward. The replicas then drift apart, and a model averager
// (parallel/optim/model_averaging.h) brings them back together after every `period` optimizer
// steps; its warm-up must equal start_iteration, so that averaging starts when the
// gradients stop being averaged globally. Without an averager the replicas never meet again.
//
// What the replicas do not share once local: each rank's optimizer state (momentum, Adam's
// moments) follows its own gradients and is never averaged, as in PyTorch; BatchNorm's
// running statistics still come from rank 0 before each forward (DDP's broadcast_buffers).
//
// Resuming: the state counts backward passes, one per optimizer step, so after loading a
// checkpoint set it from the averager's count, saved with the optimizer's state
// (state->set_iteration(optimizer.averager().step())): else the warm-up runs again.
//
// Not inside a join (parallel/process_group/join.h): a rank that ran out would shadow a global average with
// zeros where the others average locally. Local buckets inside one are an error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "parallel/ddp/comm_hooks.h"

namespace weft::parallel {

struct PostLocalSGDOptions {
  int64_t start_iteration = 0;                // PyTorch's start_localSGD_iter: global all-reduces before it
  bool post_local_gradient_allreduce = true;  // after it: average within the subgroup (true) or not at all
  // The group this rank's buckets are averaged over from start_iteration on. Unset: one per
  // machine, made by the state's constructor with new_subgroups() (parallel/process_group/distributed.h),
  // so every rank of the default group must then construct its state at the same point.
  std::optional<std::shared_ptr<ProcessGroup>> subgroup;
};

// What the hook keeps (every rank holds its own).
class PostLocalSGDState {
 public:
  // Checks the options: start_iteration >= 0; a subgroup given as null (new_group's answer
  // to a rank outside it) while post_local_gradient_allreduce is on is an error. Makes the
  // subgroup when it is unset and post_local_gradient_allreduce is on.
  explicit PostLocalSGDState(PostLocalSGDOptions options = {});

  const PostLocalSGDOptions& options() const { return options_; }
  // The group of the local averages (null with post_local_gradient_allreduce off).
  const std::shared_ptr<ProcessGroup>& subgroup() const { return subgroup_; }
  // Backward passes seen. Unlike PyTorch's counter, it goes on counting after the warm-up.
  int64_t iteration() const { return iteration_; }
  void set_iteration(int64_t iteration);  // resume (see above)
  bool local() const { return iteration_ >= options_.start_iteration; }  // the next backward's buckets stay local

 private:
  friend CommHook post_localsgd_hook(std::shared_ptr<PostLocalSGDState> state);
  PostLocalSGDOptions options_;
  std::shared_ptr<ProcessGroup> subgroup_;
  int64_t iteration_ = 0;
};

CommHook post_localsgd_hook(std::shared_ptr<PostLocalSGDState> state);

}  // namespace weft::parallel
