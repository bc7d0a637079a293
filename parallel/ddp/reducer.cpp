// Reducer: buckets, gradient hooks, launches in bucket order, the end-of-backward wait.
#include "parallel/ddp/reducer.h"

#include <algorithm>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/elementwise.h"

namespace weft::parallel {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                                int64_t first_cap_bytes, int64_t cap_bytes) {
  WEFT_CHECK(order.size() == params.size(), "assign_buckets: the order lists ", order.size(), " parameters, not ",
             params.size());
  // One open bucket per (dtype, device); a bucket closes once its bytes reach its kind's cap
  // (PyTorch's compute_bucket_assignment_by_size: a bucket may pass the cap by its last
  // parameter), and buckets are numbered in the order they close (the order their
  // all-reduces will be launched in).
  struct Open {
    DType dtype;
    Device device;
    std::vector<size_t> params;
    int64_t bytes = 0;
    bool closed_one = false;  // the kind's first bucket has closed: cap_bytes from now on
  };
  std::vector<Open> open;
  std::vector<std::vector<size_t>> buckets;
  std::vector<bool> seen(params.size(), false);
  for (size_t i : order) {
    WEFT_CHECK(i < params.size() && !seen[i], "assign_buckets: the order is not a permutation of the parameters");
    seen[i] = true;
    const Tensor& p = params[i];
    auto it = std::find_if(open.begin(), open.end(),
                           [&](const Open& o) { return o.dtype == p.dtype() && o.device == p.device(); });
    if (it == open.end()) {
      open.push_back({p.dtype(), p.device(), {}, 0});
      it = open.end() - 1;
    }
    it->params.push_back(i);
    it->bytes += p.nbytes();
    if (it->bytes >= (it->closed_one ? cap_bytes : first_cap_bytes)) {
      buckets.push_back(std::move(it->params));
      it->params.clear();
      it->bytes = 0;
      it->closed_one = true;
    }
  }
  for (Open& o : open)
    if (!o.params.empty()) buckets.push_back(std::move(o.params));
  return buckets;
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
                 ReducerOptions options)
    : params_(std::move(params)), names_(std::move(names)), group_(std::move(group)), options_(options) {
  WEFT_CHECK(group_ != nullptr, "Reducer: no process group");
  WEFT_CHECK(names_.size() == params_.size(), "Reducer: ", names_.size(), " names for ", params_.size(), " parameters");
  WEFT_CHECK(options_.bucket_cap_bytes > 0 && options_.first_bucket_cap_bytes > 0,
             "Reducer: bucket caps must be positive");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    WEFT_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "Reducer: parameter '", names_[i],
               "' must be a leaf that requires grad");
    WEFT_CHECK(is_floating(p.dtype()), "Reducer: parameter '", names_[i], "' is ", p.dtype(),
               "; gradients are reduced in floating dtypes");
  }
  hook_ = allreduce_hook();
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;  // backward meets the last layers first
  build_buckets(assign_buckets(params_, order, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes));
  used_since_reduction_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    hook_handles_.push_back(params_[i].register_post_accumulate_grad_hook([this, i](const Tensor&) { on_gradient(i); }));
}

Reducer::~Reducer() {
  for (size_t i = 0; i < params_.size() && i < hook_handles_.size(); ++i) params_[i].remove_hook(hook_handles_[i]);
}

void Reducer::set_comm_hook(CommHook hook) {
  WEFT_CHECK(hook != nullptr, "Reducer::set_comm_hook: the hook is empty");
  WEFT_CHECK(iterations_ == 0 && !expecting_, "Reducer::set_comm_hook: register the hook before the first backward");
  hook_ = std::move(hook);
  custom_hook_ = true;
}

void Reducer::build_buckets(const std::vector<std::vector<size_t>>& assignment) {
  NoGradGuard no_grad;
  bucket_indices_ = assignment;
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  position_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    bucket.params = assignment[b];
    int64_t total = 0;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      bucket.offsets.push_back(total);
      total += params_[i].numel();
      bucket_of_[i] = b;
      position_of_[i] = k;
    }
    const Tensor& first = params_[bucket.params.front()];
    bucket.buffer = zeros({total}, TensorOptions(first.dtype(), first.device()));
    buckets_.push_back(std::move(bucket));
  }
  if (options_.gradient_as_bucket_view) {
    // The gradients that exist live in the buckets from now on: backward accumulates into
    // them (a parameter without one stays without, as the optimizer expects).
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      Tensor slot = slot_of(i);
      slot.copy_(params_[i].grad());
      params_[i].set_grad(slot);
    }
  }
}

Tensor Reducer::slot_of(size_t param) const {
  const Bucket& b = buckets_[bucket_of_[param]];
  const Tensor& p = params_[param];
  return b.buffer.narrow(0, b.offsets[position_of_[param]], p.numel()).view(p.shape());
}

// A group of one with the default hook has nothing to exchange: the gradients stay where
// they are (DDP around one process costs its bookkeeping only).
bool Reducer::alone() const {
  return group_->size() == 1 && !custom_hook_ && !options_.gradient_as_bucket_view;
}

void Reducer::wait_for_launched(std::vector<std::string>* errors) {
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const std::exception& e) {
      if (errors) errors->push_back(e.what());
    }
    b.work.reset();
  }
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  if (expecting_ && backward_begun_) {
    // A backward through DDP began and never reached its end (an exception in it): its
    // buckets' collectives may have run on some ranks and not on others.
    wait_for_launched(nullptr);
    expecting_ = false;
    WEFT_FAIL(options_.owner, " (rank ", group_->rank(), "): the previous backward failed before it finished",
              options_.finish_at_end_of_backward ? "" : " (or was not followed by finish())",
              ", so the ranks' collectives are out of step; stop every rank and start the job again");
  }
  // (A forward without backward leaves nothing in flight: unused parameters are only
  // marked ready once backward has begun.)
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  ready_.assign(params_.size(), false);
  arrivals_.clear();
  unused_.clear();
  next_to_launch_ = 0;
  backward_begun_ = false;
  active_ranks_.reset();
  expecting_ = true;
  if (!options_.find_unused_parameters) return;
  // Walk the graph back from the outputs: a parameter whose accumulator is not reached
  // takes no part in this iteration; it is marked ready when backward begins.
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  for (const Tensor& out : outputs) {
    Edge e = gradient_edge(out);
    if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node);
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    for (const Edge& next : node->next_edges())
      if (next.node && seen.insert(next.node.get()).second) stack.push_back(next.node);
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!seen.count(gradient_edge(params_[i]).node.get())) unused_.push_back(i);
}

void Reducer::on_gradient(size_t param) {
  if (options_.find_unused_parameters) used_since_reduction_[param] = true;  // no_sync steps count too
  if (!expecting_) return;  // no_sync(), or a backward without a forward through DDP
  WEFT_CHECK(!ready_[param], options_.owner, ": parameter '", names_[param], "' received a gradient twice in "
             "one backward", options_.find_unused_parameters
                                 ? " (find_unused_parameters found it unused in the forward, but backward reached it)"
                                 : "");
  if (!backward_begun_) {
    if (options_.finish_at_end_of_backward) queue_backward_callback([this] { finalize(); });
    backward_begun_ = true;
    for (size_t i : unused_) mark_ready(i);  // backward has begun: their buckets may go
  }
  arrivals_.push_back(param);
  mark_ready(param);
}

void Reducer::mark_ready(size_t param) {
  NoGradGuard no_grad;
  const Tensor& grad = params_[param].grad();
  if (!alone()) {
    Tensor slot = slot_of(param);
    if (!grad.defined()) {
      fill_(slot, 0.0);  // an unused parameter without an accumulated gradient contributes zeros
    } else if (!(grad.storage() == slot.storage() && grad.offset() == slot.offset())) {
      slot.copy_(grad);  // (with gradient_as_bucket_view the gradient is the slot already)
    }
  }
  ready_[param] = true;
  --buckets_[bucket_of_[param]].pending;
  launch_ready_buckets();
}

GradBucket Reducer::grad_bucket(size_t b) const {
  GradBucket bucket;
  bucket.index = b;
  bucket.is_last = b + 1 == buckets_.size();
  bucket.buffer = buckets_[b].buffer;
  for (size_t param : buckets_[b].params) bucket.gradients.push_back(slot_of(param));
  return bucket;
}

void Reducer::launch_ready_buckets() {
  // In bucket order, so that every rank launches the same all-reduces in the same order.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& b = buckets_[next_to_launch_];
    trace::instant("bucket " + std::to_string(next_to_launch_) + " ready", b.buffer.device());
    if (!alone()) b.work = hook_(*group_, grad_bucket(next_to_launch_));
    ++next_to_launch_;
  }
}

void Reducer::finalize() {
  if (!expecting_) return;
  expecting_ = false;
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(names_[i]);
  std::vector<std::string> errors;
  {
    // Every launched bucket is waited for, also on the way to an error: its all-reduce
    // writes into the bucket, which the next iteration reuses.
    // On a GPU as the device waited: from backward's last kernel to the last bucket's end.
    DeviceTraceSpan span("wait for buckets", params_.empty() ? kCPU : params_.front().device());
    wait_for_launched(&errors);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t k = 0; k < missing.size() && k < 10; ++k) list += (k ? ", " : "") + ("'" + missing[k] + "'");
    if (missing.size() > 10) list += " and " + std::to_string(missing.size() - 10) + " more";
    const std::string advice = !options_.unused_parameter_advice.empty()
                                   ? options_.unused_parameter_advice
                                   : "Parameters that do not take part in producing the loss need "
                                     "DistributedDataParallel(..., {.find_unused_parameters = true}), which finds them "
                                     "after each forward; otherwise make every parameter take part in every forward "
                                     "(PyTorch raises the same error)";
    WEFT_FAIL(options_.owner, " (rank ", group_->rank(), "): parameter(s) ", list, " received no gradient in this "
              "backward, so their buckets were never reduced and the other ranks are left waiting. ", advice);
  }
  WEFT_CHECK(errors.empty(), options_.owner, " (rank ", group_->rank(), "): a bucket's all-reduce failed: ",
             errors.front());
  arrival_order_ = arrivals_;
  ++iterations_;
  if (active_ranks_) {
    const int64_t active = active_ranks_->wait();
    active_ranks_.reset();
    if (!alone()) rescale_to_active(active);
  }
  if (!alone()) write_back();
  if (!rebuilt_) rebuild_from_arrival_order();
}

void Reducer::finish() {
  WEFT_CHECK(!options_.finish_at_end_of_backward, options_.owner, ": Reducer::finish() is for a reducer made with "
             "finish_at_end_of_backward = false (this one finishes at the end of each backward)");
  WEFT_CHECK(expecting_, options_.owner, " (rank ", group_->rank(),
             "): Reducer::finish() without prepare_for_backward");
  finalize();
}

void Reducer::divide_by_active_ranks(ActiveRanks active) {
  WEFT_CHECK(expecting_, "Reducer::divide_by_active_ranks: call it after prepare_for_backward");
  active_ranks_.emplace(std::move(active));
}

void Reducer::rescale_to_active(int64_t active) {
  WEFT_CHECK(active >= 1 && active <= group_->size(), options_.owner, " (rank ", group_->rank(), "): join: ",
             active, " ranks still iterating in a group of ", group_->size());
  if (active == group_->size()) return;
  NoGradGuard no_grad;
  for (Bucket& b : buckets_) mul_(b.buffer, static_cast<double>(group_->size()) / static_cast<double>(active));
}

void Reducer::reduce_as_joined_rank(std::optional<int64_t> active) {
  WEFT_CHECK(!expecting_, options_.owner, " (rank ", group_->rank(), "): a rank that ran out of inputs in a "
             "join made a forward through DDP that was not followed by its backward");
  NoGradGuard no_grad;
  {
    TraceSpan span("join: buckets with zeros", params_.empty() ? kCPU : params_.front().device());
    // As if this rank had called zero_grad() and taken part without samples.
    for (Tensor& p : params_) p.set_grad(Tensor());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      fill_(buckets_[b].buffer, 0.0);
      buckets_[b].work = hook_(*group_, grad_bucket(b));
    }
    std::vector<std::string> errors;
    wait_for_launched(&errors);
    WEFT_CHECK(errors.empty(), options_.owner, " (rank ", group_->rank(), "): join: a bucket's all-reduce "
               "failed: ", errors.front());
  }
  ++iterations_;
  if (active) rescale_to_active(*active);
  write_back();
  if (!rebuilt_) rebuild_from_arrival_order();
}

void Reducer::write_back() {
  // With find_unused_parameters, a parameter that no rank used since the last reduction
  // keeps whatever gradient it had (none, usually), as on one process.
  std::vector<bool> globally_used(params_.size(), true);
  if (options_.find_unused_parameters) {
    std::vector<int64_t> used(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) used[i] = used_since_reduction_[i] ? 1 : 0;
    Tensor flags = tensor(used, Shape{static_cast<int64_t>(used.size())});
    if (!used.empty()) flags = flags.to(params_.front().device());  // nccl takes CUDA tensors only
    if (!used.empty()) group_->all_reduce(flags, ReduceOp::Max)->wait();
    auto v = flags.to_vector<int64_t>();
    for (size_t i = 0; i < v.size(); ++i) globally_used[i] = v[i] != 0;
    used_since_reduction_.assign(params_.size(), false);
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!globally_used[i]) continue;
    Tensor slot = slot_of(i);
    Tensor& p = params_[i];
    if (options_.gradient_as_bucket_view) {
      p.set_grad(slot);
    } else if (p.grad().defined()) {
      p.grad().copy_(slot);
    } else {
      p.set_grad(slot.clone());
    }
  }
}

void Reducer::rebuild_from_arrival_order() {
  rebuilt_ = true;
  // Rank 0's order, so that every rank builds the same buckets; parameters that sent no
  // gradient go last, in reverse registration order.
  std::vector<int64_t> order;
  std::vector<bool> listed(params_.size(), false);
  for (size_t i : arrival_order_) {
    order.push_back(static_cast<int64_t>(i));
    listed[i] = true;
  }
  for (size_t k = params_.size(); k-- > 0;)
    if (!listed[k]) order.push_back(static_cast<int64_t>(k));
  Tensor shared = tensor(order, Shape{static_cast<int64_t>(order.size())});
  if (!params_.empty()) shared = shared.to(params_.front().device());  // nccl takes CUDA tensors only
  if (!order.empty() && group_->size() > 1) group_->broadcast(shared, 0)->wait();
  std::vector<size_t> agreed;
  for (int64_t v : shared.to_vector<int64_t>()) agreed.push_back(static_cast<size_t>(v));
  auto assignment = assign_buckets(params_, agreed, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  if (assignment != bucket_indices_) build_buckets(assignment);
}

}  // namespace weft::parallel
