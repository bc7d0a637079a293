// Reducer: DistributedDataParallel's gradient all-reduce, bucketed and overlapped with
// backward (PyTorch's c10d Reducer).
//
// Parameters are assigned to buckets in the order their gradients become ready: at first
// the reverse of registration order (backward runs the last layers first), after the
// first iteration the order the gradients actually arrived in on rank 0 (broadcast, so
// every rank agrees). A bucket holds parameters of one dtype and device until they reach
// bucket_cap bytes (the first of each dtype and device first_bucket_cap, so that
// communication starts early), as PyTorch's, in one flat buffer. During backward a hook on
// each parameter (its post-accumulate-grad hook) copies the gradient into its slot of the
// bucket; when a bucket's last gradient is in, its all-reduce is launched asynchronously, in
// bucket order on every rank, while backward goes on with the layers before. When backward
// has run every node, a callback waits for the buckets (Note: the last one is launched last,
// so most of the communication is hidden) and writes the averaged gradients back to the
// parameters; or, for a pipeline's stage (finish_at_end_of_backward false), finish() does
// that once the rank's step is done.
//
// A parameter that took no part in the forward never gets a gradient, so its bucket would
// never be launched and every rank would wait: with find_unused_parameters the reducer
// walks the autograd graph from the forward's outputs and, once backward has begun, marks
// such parameters ready (contributing zeros, or the gradient they accumulated under
// no_sync); a parameter no rank used keeps its gradient as it was. Without the flag, a
// parameter still missing at the end of backward is an error that names it. A backward
// that fails half-way leaves the ranks' collectives out of step: the next forward says so
// instead of hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/ddp/comm_hooks.h"
#include "parallel/process_group/join.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

struct ReducerOptions {
  int64_t bucket_cap_bytes = int64_t{25} << 20;
  int64_t first_bucket_cap_bytes = int64_t{1} << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  // false: the end of backward leaves the launched buckets in flight and finish() waits for
  // them (a pipeline's stage: its last micro-batch's backward launches them, and its rank goes on
  // sending gradients to the previous stage while they run).
  bool finish_at_end_of_backward = true;
  // Whose reducer it is, for errors, and what the error for a parameter without a gradient
  // advises (empty: DDP's find_unused_parameters).
  std::string owner = "DistributedDataParallel";
  std::string unused_parameter_advice;
};

// Parameter indices per bucket: `order` lists every parameter once, in the order their
// gradients become ready; a bucket takes parameters of one dtype and device until its bytes
// reach the cap, the parameter that reaches it included (first_cap_bytes for the first bucket
// of each dtype and device, cap_bytes after), as PyTorch's DDP assigns them.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                                int64_t first_cap_bytes, int64_t cap_bytes);

class Reducer {
 public:
  // names: the parameters' names, for errors.
  Reducer(std::vector<Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
          ReducerOptions options);
  ~Reducer();  // removes its hooks
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called after each forward that a synchronised backward will follow: resets the
  // buckets, and (find_unused_parameters) marks the parameters that `outputs` do not
  // depend on as ready.
  void prepare_for_backward(const std::vector<Tensor>& outputs);
  // Between prepare_for_backward and the end of backward: the reducer is waiting for
  // gradients.
  bool expecting_gradients() const { return expecting_; }
  // With finish_at_end_of_backward false, after the backward: waits for the buckets and writes
  // the averages into the gradients, as the end of backward does otherwise.
  void finish();

  // Inside a join (parallel/process_group/join.h), after prepare_for_backward: this backward's averages
  // are over the ranks still iterating, `active` (counted while backward runs), not over
  // the group.
  void divide_by_active_ranks(ActiveRanks active);
  // Inside a join, on a rank that ran out, in place of a backward of the others: every
  // bucket all-reduced with zeros from this rank, in bucket order through the hook, and the
  // averages (over `active` ranks if given, else over the group) written to the gradients as
  // on the others: a parameter none of them used keeps no gradient, as after zero_grad().
  void reduce_as_joined_rank(std::optional<int64_t> active);

  size_t parameter_count() const { return params_.size(); }
  void set_comm_hook(CommHook hook);
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_indices_; }
  // Backward passes reduced so far (on a rank that ran out in a join, the shadowed ones too).
  int64_t iterations() const { return iterations_; }
  // The order in which the last reduced backward delivered the gradients (parameter indices).
  const std::vector<size_t>& arrival_order() const { return arrival_order_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // element offset of each parameter in `buffer`
    Tensor buffer;                 // flat, on the parameters' device, in their dtype
    size_t pending = 0;            // gradients still to come in this backward
    std::shared_ptr<Work> work;
  };

  void build_buckets(const std::vector<std::vector<size_t>>& assignment);
  Tensor slot_of(size_t param) const;  // the view of `param` in its bucket
  void on_gradient(size_t param);      // the post-accumulate-grad hook
  void mark_ready(size_t param);       // its gradient (or zeros, without one) is in its slot
  GradBucket grad_bucket(size_t b) const;  // bucket b as the hook sees it
  void launch_ready_buckets();
  void rescale_to_active(int64_t active);  // averages over the group become averages over `active` ranks
  void finalize();                     // the end-of-backward callback, or finish()
  void write_back();                   // the averages into the parameters' gradients
  void wait_for_launched(std::vector<std::string>* errors);
  void rebuild_from_arrival_order();
  bool alone() const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  CommHook hook_;
  bool custom_hook_ = false;
  std::vector<HookHandle> hook_handles_;

  std::vector<std::vector<size_t>> bucket_indices_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;    // parameter -> bucket
  std::vector<size_t> position_of_;  // parameter -> its place in its bucket
  std::vector<bool> ready_;          // parameter -> its gradient is in its slot this backward
  std::vector<size_t> unused_;       // find_unused_parameters: not reached by this forward
  std::vector<bool> used_since_reduction_;  // find_unused_parameters: got a gradient (no_sync steps too)
  size_t next_to_launch_ = 0;
  bool expecting_ = false;
  bool backward_begun_ = false;  // since prepare_for_backward: a gradient arrived
  int64_t iterations_ = 0;
  bool rebuilt_ = false;
  std::optional<ActiveRanks> active_ranks_;  // divide_by_active_ranks
  std::vector<size_t> arrival_order_, arrivals_;
};

}  // namespace weft::parallel
