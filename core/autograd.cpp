// Nodes, edges, saved tensors and the in-place rules of autograd.
#include "core/autograd.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "core/copy.h"
#include "core/gradient_ops.h"
#include "core/thread_state.h"

namespace weft {

namespace {
// Per thread (Note [Execution order]): nodes made on several threads at once get numbers
// that do not depend on how the threads interleave.
thread_local uint64_t this_thread_next_sequence_nr = 0;
std::atomic<uint64_t> next_hook{1};
}  // namespace

uint64_t next_sequence_nr() { return this_thread_next_sequence_nr; }
void set_next_sequence_nr(uint64_t next) { this_thread_next_sequence_nr = next; }

HookHandle next_hook_handle() { return next_hook.fetch_add(1, std::memory_order_relaxed); }

Node::Node(const char* name) : name_(name), sequence_nr_(this_thread_next_sequence_nr++) {}

HookHandle Node::add_pre_hook(uint32_t output_nr, TensorHook hook) {
  HookHandle handle = next_hook_handle();
  pre_hooks_.push_back({handle, output_nr, std::move(hook)});
  return handle;
}

bool Node::remove_pre_hook(HookHandle handle) {
  auto it = std::find_if(pre_hooks_.begin(), pre_hooks_.end(), [&](const PreHook& h) { return h.handle == handle; });
  if (it == pre_hooks_.end()) return false;
  pre_hooks_.erase(it);
  return true;
}

void Node::run_pre_hooks(uint32_t output_nr, Tensor& grad) const {
  for (const PreHook& h : pre_hooks_) {
    if (h.output_nr != output_nr) continue;
    Tensor replaced = h.fn(grad);
    if (!replaced.defined()) continue;
    WEFT_CHECK(replaced.shape() == grad.shape() && replaced.dtype() == grad.dtype() &&
                   replaced.device() == grad.device(),
               "tensor hook on ", name_, " returned a gradient ", replaced.shape(), " ", replaced.dtype(), " on ",
               replaced.device(), " in place of ", grad.shape(), " ", grad.dtype(), " on ", grad.device());
    grad = std::move(replaced);
  }
}

uint32_t Node::add_output(const Tensor& t) {
  outputs_.push_back({t.shape(), t.dtype(), t.device()});
  return static_cast<uint32_t>(outputs_.size() - 1);
}

void fail_backward_twice(const char* node_name) {
  WEFT_FAIL("backward: trying to backward through the graph a second time (the saved state of ", node_name,
            " was freed by the first backward); pass retain_graph=true to the first backward");
}

// --- AccumulateGrad -----------------------------------------------------------------

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf)
    : Node("AccumulateGrad", std::numeric_limits<uint64_t>::max()), leaf_(leaf) {
  add_output(Tensor(leaf));
}

void AccumulateGrad::accumulate(Tensor& grad, Tensor& incoming) {
  std::lock_guard lock(mutex_);
  if (!grad.defined()) {
    // Take the incoming gradient when nobody else holds it; otherwise copy, so that
    // a later in-place accumulation cannot write into another tensor's values.
    bool exclusive = incoming.impl_ptr().use_count() == 1 && incoming.storage().use_count() == 1 &&
                     incoming.is_contiguous();
    grad = exclusive ? incoming.detach() : incoming.clone();
  } else {
    gradient_ops().accumulate(grad, incoming);
  }
}

GradList AccumulateGrad::apply(GradList&& grads) {
  auto impl = leaf_.lock();
  if (!impl) return {};  // the leaf is gone; nobody can read its gradient
  Tensor leaf(impl);
  accumulate(impl->autograd->grad, grads[0]);
  for (auto& [handle, hook] : post_hooks_) hook(leaf);
  return {};
}

HookHandle AccumulateGrad::add_post_hook(PostAccumulateGradHook hook) {
  HookHandle handle = next_hook_handle();
  post_hooks_.emplace_back(handle, std::move(hook));
  return handle;
}

bool AccumulateGrad::remove_post_hook(HookHandle handle) {
  auto it = std::find_if(post_hooks_.begin(), post_hooks_.end(), [&](const auto& h) { return h.first == handle; });
  if (it == post_hooks_.end()) return false;
  post_hooks_.erase(it);
  return true;
}

// --- recording ----------------------------------------------------------------------

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  const AutogradMeta* m = t.impl()->autograd.get();
  if (m == nullptr) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (m->requires_grad) return {m->grad_accumulator, 0};
  return {};
}

bool any_requires_grad(std::span<const Tensor> tensors) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void set_history(const Tensor& out, const std::shared_ptr<Node>& node) {
  AutogradMeta& m = out.autograd_meta();
  m.output_nr = node->add_output(out);
  m.grad_fn = node;
  m.requires_grad = false;  // a non-leaf requires grad through its grad_fn
  m.grad_accumulator.reset();
}

SavedTensor::SavedTensor(const Tensor& t, bool is_output) : tensor_(is_output ? t.detach() : t), version_(t.version()) {}

const Tensor& SavedTensor::unpack() const {
  WEFT_CHECK(tensor_.version() == version_, "backward: a tensor of shape ", tensor_.shape(),
             " saved for the gradient was modified by an in-place operation (its version is ", tensor_.version(),
             ", expected ", version_, "); use an out-of-place op or clone() it first");
  return tensor_;
}

// --- in-place -----------------------------------------------------------------------

void check_inplace(const Tensor& self, const char* op) {
  WEFT_CHECK(!(self.is_leaf() && self.requires_grad()), op, ": a leaf tensor that requires grad (shape ",
             self.shape(), ") is used in an in-place operation; do it under NoGradGuard or on a clone()");
  WEFT_CHECK(!self.is_view(), op, ": in-place operation on a view (shape ", self.shape(),
             ") while autograd is recording is not supported; use the out-of-place op");
}

const Tensor& commit_inplace(const Tensor& self, const Tensor& result, const char* op) {
  WEFT_CHECK(result.shape() == self.shape(), op, ": the result has shape ", result.shape(),
             " but an in-place op cannot change the shape ", self.shape());
  {
    NoGradGuard no_grad;
    copy_values(self, result);
  }
  // self now holds result's values, so it takes result's history; a result without
  // history (fill_) cuts self off from its old one.
  AutogradMeta& m = self.autograd_meta();
  m.grad_fn = result.grad_fn();
  m.output_nr = result.output_nr();
  m.requires_grad = false;
  m.grad_accumulator.reset();
  return self;
}

}  // namespace weft
