// The post-local SGD communication hook; see post_localsgd_hook.h.
#include "parallel/ddp/post_localsgd_hook.h"

#include "core/error.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/join.h"

namespace weft::parallel {

PostLocalSGDState::PostLocalSGDState(PostLocalSGDOptions options) : options_(std::move(options)) {
  WEFT_CHECK(options_.start_iteration >= 0, "PostLocalSGDState: start_iteration must be >= 0, got ",
             options_.start_iteration);
  if (!options_.post_local_gradient_allreduce) return;
  if (!options_.subgroup) {
    subgroup_ = new_subgroups();
  } else {
    subgroup_ = *options_.subgroup;
    WEFT_CHECK(subgroup_ != nullptr, "PostLocalSGDState: the subgroup given is null (new_group's answer on a rank "
               "outside it): give each rank the subgroup it belongs to, or turn post_local_gradient_allreduce off");
  }
}

void PostLocalSGDState::set_iteration(int64_t iteration) {
  WEFT_CHECK(iteration >= 0, "PostLocalSGDState::set_iteration: the count must be >= 0, got ", iteration);
  iteration_ = iteration;
}

CommHook post_localsgd_hook(std::shared_ptr<PostLocalSGDState> state) {
  WEFT_CHECK(state != nullptr, "post_localsgd_hook: needs a PostLocalSGDState");
  return [state](ProcessGroup& group, const GradBucket& bucket) {
    PostLocalSGDState& s = *state;
    const bool local = s.local();
    if (bucket.is_last) ++s.iteration_;
    if (!local) return group.all_reduce(bucket.buffer, ReduceOp::Avg);
    WEFT_CHECK(!join_running(), "post_localsgd_hook: local SGD cannot run inside a join (iteration ",
               s.iteration_ - (bucket.is_last ? 1 : 0), ", after the warm-up of ", s.options_.start_iteration,
               "): a rank that ran out would shadow with global averages what the others average locally");
    if (!s.options_.post_local_gradient_allreduce) return completed_work();
    return s.subgroup_->all_reduce(bucket.buffer, ReduceOp::Avg);
  };
}

}  // namespace weft::parallel
