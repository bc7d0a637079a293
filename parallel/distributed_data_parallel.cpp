// DistributedDataParallel: the checks and broadcasts of construction, the forward.
#include "parallel/distributed_data_parallel.h"

#include <algorithm>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/shape_ops.h"
#include "parallel/distributed.h"

namespace weft::parallel {

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string describe(const nn::NamedTensors& named, const char* kind) {
  std::ostringstream out;
  for (const auto& [name, t] : named) out << kind << " '" << name << "' is " << t.dtype() << " " << t.shape() << "\n";
  return out.str();
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
  const std::string mine = describe(module().named_parameters(), "parameter") +
                           describe(module().named_buffers(), "buffer");
  // Every rank's description, padded to the longest, all-gathered (on the parameters'
  // device: the nccl backend takes CUDA tensors only).
  const auto params = module().parameters();
  const Device device = params.empty() ? kCPU : params.front().device();
  Tensor length = tensor(std::vector<int64_t>{static_cast<int64_t>(mine.size())}).to(device);
  group_->all_reduce(length, ReduceOp::Max)->wait();
  const int64_t longest = length.item<int64_t>();
  std::vector<uint8_t> bytes(static_cast<size_t>(longest), 0);
  std::copy(mine.begin(), mine.end(), bytes.begin());
  Tensor local = tensor(bytes, Shape{longest}).to(device);
  std::vector<Tensor> all;
  for (int r = 0; r < group_->size(); ++r) all.push_back(zeros({longest}, TensorOptions(DType::UInt8, device)));
  if (longest > 0) group_->all_gather(all, local)->wait();
  std::vector<std::vector<std::string>> ranks;
  for (const Tensor& t : all) {
    std::string text;
    for (uint8_t v : t.to_vector<uint8_t>())
      if (v != 0) text += static_cast<char>(v);
    ranks.push_back(lines_of(text));
  }
  for (size_t r = 1; r < ranks.size(); ++r) {
    const auto& a = ranks[0];
    const auto& b = ranks[r];
    for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
      if (k < a.size() && k < b.size() && a[k] == b[k]) continue;
      WEFT_FAIL("DistributedDataParallel: the ranks' models differ: on rank 0, ",
                k < a.size() ? a[k] : std::string("there is nothing more"), "; on rank ", r, ", ",
                k < b.size() ? b[k] : std::string("there is nothing more"),
                " (every rank must build the same model before wrapping it)");
    }
  }
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
