// DistributedDataParallel: the checks and broadcasts of construction, the forward.
#include "parallel/ddp/distributed_data_parallel.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/process_group/coalesced_collectives.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/text_collectives.h"

namespace weft::parallel {

namespace {

std::vector<std::string> describe(const nn::NamedTensors& named, const char* kind) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) {
    std::ostringstream line;
    line << kind << " '" << name << "' is " << t.dtype() << " " << t.shape();
    out.push_back(line.str());
  }
  return out;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> wrapped,
                                                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : Cloneable("DistributedDataParallel"), group_(std::move(group)), options_(options) {
  WEFT_CHECK(wrapped != nullptr, "DistributedDataParallel: the module is null");
  if (!group_) group_ = default_group_ptr();
  WEFT_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_mb > 0,
             "DistributedDataParallel: bucket_cap_mb and first_bucket_mb must be positive");
  register_module("module", std::move(wrapped));
  check_same_parameters_on_every_rank();
  // Every replica starts from rank 0's parameters and buffers.
  broadcast_from(module().parameters(), 0);
  broadcast_from(module().buffers(), 0);
  const auto all_params = module().parameters();
  device_ = all_params.empty() ? kCPU : all_params.front().device();
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : module().named_parameters()) {
    if (!p.requires_grad()) continue;  // frozen parameters take no part, as in PyTorch
    params.push_back(p);
    names.push_back(name);
  }
  ReducerOptions r;
  r.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_cap_mb * (1 << 20));
  r.first_bucket_cap_bytes = static_cast<int64_t>(options_.first_bucket_mb * (1 << 20));
  r.find_unused_parameters = options_.find_unused_parameters;
  r.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer_ = std::make_shared<Reducer>(std::move(params), std::move(names), group_, r);
}

DistributedDataParallel::DistributedDataParallel(const DistributedDataParallel& other)
    : Cloneable(other), group_(other.group_), options_(other.options_), device_(other.device_),
      require_sync_(other.require_sync_) {}

Reducer& DistributedDataParallel::reducer() const {
  WEFT_CHECK(reducer_ != nullptr, "DistributedDataParallel: this copy has no reducer (only the original reduces)");
  return *reducer_;
}

void DistributedDataParallel::check_same_parameters_on_every_rank() const {
  std::vector<std::string> mine = describe(module().named_parameters(), "parameter");
  for (std::string& line : describe(module().named_buffers(), "buffer")) mine.push_back(std::move(line));
  // On the parameters' device: the nccl backend takes CUDA tensors only.
  const auto params = module().parameters();
  const Device device = params.empty() ? kCPU : params.front().device();
  if (auto difference = first_difference_across_ranks(*group_, mine, device))
    WEFT_FAIL("DistributedDataParallel: the ranks' models differ: ", *difference,
              " (every rank must build the same model before wrapping it)");
}

void DistributedDataParallel::broadcast_from(const std::vector<Tensor>& tensors, int root) const {
  broadcast_tensors(tensors, *group_, root);
}

bool DistributedDataParallel::syncs_buffers() const {
  return options_.broadcast_buffers && group_->size() > 1 && !module().buffers().empty();
}

int DistributedDataParallel::highest_rank_where(bool candidate) const {
  Tensor rank = tensor(std::vector<int64_t>{candidate ? group_->rank() : -1}, Shape{1}).to(device_);
  group_->all_reduce(rank, ReduceOp::Max)->wait();
  const int64_t highest = rank.to_vector<int64_t>().front();
  WEFT_CHECK(highest >= 0, "DistributedDataParallel (rank ", group_->rank(), "): join: no rank was a candidate");
  return static_cast<int>(highest);
}

void DistributedDataParallel::announce_whether_backward_reduces(bool reduces) const {
  Tensor flag = tensor(std::vector<int64_t>{reduces ? 1 : 0}, Shape{1}).to(device_);
  group_->all_reduce(flag, ReduceOp::Sum);  // not waited for: only the ranks that ran out read it
}

bool DistributedDataParallel::backward_reduces_elsewhere() const {
  Tensor flag = tensor(std::vector<int64_t>{0}, Shape{1}).to(device_);
  group_->all_reduce(flag, ReduceOp::Sum)->wait();
  return flag.to_vector<int64_t>().front() != 0;
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  nn::Module& wrapped = module();
  WEFT_CHECK(reducer_ != nullptr, "DistributedDataParallel: forward on a copy (clone) of a DDP module; use the "
             "original, which holds the reducer");
  // Collectives in training forwards only: evaluation shards may differ in length between
  // ranks (a DistributedEvalSampler does not pad), and a collective in an unequal number of
  // forwards would hang.
  const bool training = GradMode::is_enabled();
  std::optional<ActiveRanks> active;
  if (training) active = notify_join_context();
  if (training && syncs_buffers()) {
    // In a join rank 0 may have run out, with stale buffers: the highest rank still iterating sends.
    TraceSpan span("broadcast buffers", input.device());
    broadcast_from(wrapped.buffers(), in_join() ? highest_rank_where(true) : 0);
  }
  if (training && in_join()) announce_whether_backward_reduces(require_sync_);
  Tensor output;
  {
    TraceSpan span("forward", input.device());
    output = wrapped.forward(input);
  }
  if (training && require_sync_) {
    reducer_->prepare_for_backward({output});
    if (active && !join_options().divide_by_initial_world_size) reducer_->divide_by_active_ranks(std::move(*active));
  }
  return output;
}

// A rank that ran out: per iteration of the others, their forward's collectives, then, if
// their backward reduces, the buckets with zeros from this rank (Reducer::reduce_as_joined_rank).
// At the end, the model of the highest rank among those that ran out last reaches every rank.
class DistributedDataParallel::ShadowingHook : public parallel::JoinHook {
 public:
  ShadowingHook(DistributedDataParallel& ddp, JoinOptions options) : ddp_(ddp), options_(options) {}

  void main_hook(JoinRound& round) override {
    if (ddp_.syncs_buffers()) ddp_.broadcast_from(ddp_.module().buffers(), ddp_.highest_rank_where(false));
    round.gradients_reduced = ddp_.backward_reduces_elsewhere();
    if (!round.gradients_reduced) return;  // their backward runs under no_sync
    ddp_.reducer().reduce_as_joined_rank(options_.divide_by_initial_world_size ? std::nullopt
                                                                               : std::optional<int64_t>(round.active));
  }

  void post_hook(bool is_last_joiner) override {
    if (ddp_.group_->size() == 1) return;
    const int root = ddp_.highest_rank_where(is_last_joiner);
    ddp_.broadcast_from(ddp_.module().parameters(), root);
    ddp_.broadcast_from(ddp_.module().buffers(), root);
  }

 private:
  DistributedDataParallel& ddp_;
  JoinOptions options_;
};

std::unique_ptr<JoinHook> DistributedDataParallel::join_hook(const JoinOptions& options) {
  reducer();  // a copy has none
  WEFT_CHECK(first_in_join(), "DistributedDataParallel: a join needs the DDP module first in its list (its forward "
             "announces each iteration, and its hook must shadow the backward before an optimizer's hook steps on the "
             "gradients), and one DDP module per join");
  return std::make_unique<ShadowingHook>(*this, options);
}

void DistributedDataParallel::join(const std::function<void()>& body, const JoinOptions& options) {
  parallel::join({this}, body, options);
}

std::string DistributedDataParallel::extra_repr() const {
  std::ostringstream out;
  out << "rank=" << group_->rank() << ", world_size=" << group_->size() << ", bucket_cap_mb=" << options_.bucket_cap_mb
      << (options_.find_unused_parameters ? ", find_unused_parameters=true" : "")
      << (options_.gradient_as_bucket_view ? ", gradient_as_bucket_view=true" : "");
  return out.str();
}

}  // namespace weft::parallel
