// DistributedDataParallel: the checks and broadcasts of construction, the forward.
#include "parallel/distributed_data_parallel.h"

#include <algorithm>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/shape_ops.h"
#include "parallel/distributed.h"
#include "parallel/text_collectives.h"

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
  broadcast_from_rank0(module().parameters());
  broadcast_from_rank0(module().buffers());
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
    : Cloneable(other), group_(other.group_), options_(other.options_), require_sync_(other.require_sync_) {}

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

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors) const {
  if (group_->size() == 1 || tensors.empty()) return;
  NoGradGuard no_grad;
  // One flat broadcast per (dtype, device): few messages instead of one per tensor.
  std::vector<bool> done(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (done[i]) continue;
    std::vector<size_t> group;
    for (size_t j = i; j < tensors.size(); ++j)
      if (!done[j] && tensors[j].dtype() == tensors[i].dtype() && tensors[j].device() == tensors[i].device()) {
        group.push_back(j);
        done[j] = true;
      }
    std::vector<Tensor> pieces;
    for (size_t j : group) pieces.push_back(tensors[j].detach().reshape({-1}));
    Tensor flat = cat(pieces).contiguous();
    group_->broadcast(flat, 0)->wait();
    int64_t offset = 0;
    for (size_t j : group) {
      tensors[j].detach().copy_(flat.narrow(0, offset, tensors[j].numel()).view(tensors[j].shape()));
      offset += tensors[j].numel();
    }
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  nn::Module& wrapped = module();
  WEFT_CHECK(reducer_ != nullptr, "DistributedDataParallel: forward on a copy (clone) of a DDP module; use the "
             "original, which holds the reducer");
  // Training forwards only: evaluation shards may differ in length between ranks (a
  // DistributedEvalSampler does not pad), and a collective in an unequal number of forwards
  // would hang.
  if (options_.broadcast_buffers && group_->size() > 1 && GradMode::is_enabled()) {
    TraceSpan span("broadcast buffers", input.device());
    broadcast_from_rank0(wrapped.buffers());
  }
  Tensor output;
  {
    TraceSpan span("forward", input.device());
    output = wrapped.forward(input);
  }
  if (GradMode::is_enabled() && require_sync_) reducer_->prepare_for_backward({output});
  return output;
}

std::string DistributedDataParallel::extra_repr() const {
  std::ostringstream out;
  out << "rank=" << group_->rank() << ", world_size=" << group_->size() << ", bucket_cap_mb=" << options_.bucket_cap_mb
      << (options_.find_unused_parameters ? ", find_unused_parameters=true" : "")
      << (options_.gradient_as_bucket_view ? ", gradient_as_bucket_view=true" : "");
  return out.str();
}

}  // namespace weft::parallel
