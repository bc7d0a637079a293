// The post-local SGD communication hook; see post_localsgd_hook.h.
#include "parallel/post_localsgd_hook.h"

#include "core/error.h"
#include "parallel/distributed.h"

namespace weft::parallel {

PostLocalSGDState::PostLocalSGDState(std::shared_ptr<ProcessGroup> subgroup, PostLocalSGDOptions options)
    : subgroup_(std::move(subgroup)), options_(options) {
  WEFT_CHECK(options_.start_iteration >= 0, "PostLocalSGDState: start_iteration must be >= 0, got ",
             options_.start_iteration);
  if (subgroup_ == nullptr && options_.post_local_gradient_allreduce) subgroup_ = new_subgroups();
}

CommHook post_localsgd_hook(std::shared_ptr<PostLocalSGDState> state) {
  WEFT_CHECK(state != nullptr, "post_localsgd_hook: needs a PostLocalSGDState");
  return [state](ProcessGroup& group, const GradBucket& bucket) {
    PostLocalSGDState& s = *state;
    const bool local = s.local();
    if (bucket.is_last) ++s.iteration_;
    if (!local) return group.all_reduce(bucket.buffer, ReduceOp::Avg);
    if (!s.options_.post_local_gradient_allreduce) return completed_work();
    return s.subgroup_->all_reduce(bucket.buffer, ReduceOp::Avg);
  };
}

}  // namespace weft::parallel
