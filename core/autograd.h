// Autograd: the dynamic tape.
//
// Each differentiable op records a Node whose next_edges point at the nodes that
// produced its inputs (an AccumulateGrad node for a leaf). backward() walks that graph on
// one host thread in a deterministic order (see core/engine.cpp). The shape follows
// micrograd (topological order, reverse sweep, gradients accumulate) with PyTorch's
// additions that the parallel layer needs: tensor hooks, post-accumulate-grad hooks on
// leaves, saved-tensor version checks, retain_graph.
//
// An op records its backward as a lambda next to its forward:
//
//   Tensor out = ...forward...;
//   if (any_requires_grad(a, b))
//     set_history(out, make_node("MulBackward",
//         [sa = SavedTensor(a), sb = SavedTensor(b)](const GradList& g) -> GradList {
//           return {mul(g[0], sb.unpack()), mul(g[0], sa.unpack())};
//         }, a, b));
//
// The lambda returns one gradient per input (undefined for inputs that need none); it
// runs with grad mode off and gets a defined, correctly shaped gradient for each output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace weft {

using GradList = std::vector<Tensor>;

// --- grad mode ----------------------------------------------------------------------

class GradMode {
 public:
  static bool is_enabled() { return enabled_; }
  static void set_enabled(bool enabled) { enabled_ = enabled; }

 private:
  static inline thread_local bool enabled_ = true;
};

class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// --- graph --------------------------------------------------------------------------

struct Edge {
  std::shared_ptr<Node> node;  // null: this input needs no gradient
  uint32_t input_nr = 0;       // which output of `node` the input was
};

// What a node's output looked like, so the engine can check a gradient against it and
// make zeros for an output that received none.
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node {
 public:
  explicit Node(const char* name);
  // A node with a sequence number of its own (AccumulateGrad: the highest, see below).
  Node(const char* name, uint64_t sequence_nr) : name_(name), sequence_nr_(sequence_nr) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const char* name() const { return name_; }
  // Creation order; the engine runs ready nodes latest-created first (deterministic).
  uint64_t sequence_nr() const { return sequence_nr_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  bool needs_input_grad(size_t i) const { return i < next_edges_.size() && next_edges_[i].node; }
  size_t num_outputs() const { return outputs_.size(); }
  const OutputMeta& output_meta(size_t i) const { return outputs_[i]; }

  // grads[i] is the gradient of output i; returns one gradient per next edge.
  virtual GradList apply(GradList&& grads) = 0;
  // Drops saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  HookHandle add_pre_hook(uint32_t output_nr, TensorHook hook);
  bool remove_pre_hook(HookHandle handle);
  // Runs the hooks registered on output `output_nr` over grad, in registration order.
  void run_pre_hooks(uint32_t output_nr, Tensor& grad) const;

  void reserve_edges(size_t n) { next_edges_.reserve(n); }
  void set_output_meta(size_t i, const Tensor& t) { outputs_[i] = {t.shape(), t.dtype(), t.device()}; }
  void add_next_edge(Edge edge) { next_edges_.push_back(std::move(edge)); }
  uint32_t add_output(const Tensor& t);

 private:
  struct PreHook {
    HookHandle handle;
    uint32_t output_nr;
    TensorHook fn;
  };
  const char* name_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
  std::vector<PreHook> pre_hooks_;
};

// A node whose backward is a lambda. release_saved() destroys the lambda and with it
// every tensor it captured; using the node afterwards is the classic "backward through
// the graph a second time" error.
template <class F>
class LambdaNode final : public Node {
 public:
  LambdaNode(const char* name, F&& fn) : Node(name), fn_(std::move(fn)) {}
  GradList apply(GradList&& grads) override {
    if (!fn_) [[unlikely]] fail_freed();
    return (*fn_)(grads);
  }
  void release_saved() override { fn_.reset(); }

 private:
  [[noreturn]] void fail_freed() const;
  std::optional<F> fn_;
};

[[noreturn]] void fail_backward_twice(const char* node_name);
template <class F>
void LambdaNode<F>::fail_freed() const {
  fail_backward_twice(name());
}

// The node at the end of every leaf's path: adds the incoming gradient into .grad, then
// runs the post-accumulate-grad hooks. Backward passes on several threads may reach one
// leaf at once (replicas sharing parameters): the accumulation holds a lock. Its sequence
// number is the highest there is, so it runs as soon as its gradient is complete rather
// than after every node made after the leaf (all of them): the hooks then fire while
// backward goes on, which is what lets DDP's all-reduces overlap it (PyTorch does the same).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  GradList apply(GradList&& grads) override;
  HookHandle add_post_hook(PostAccumulateGradHook hook);
  bool remove_post_hook(HookHandle handle);
  // After Tensor::set_data: the leaf's new shape, dtype and device.
  void reset_leaf_meta(const Tensor& leaf) { set_output_meta(0, leaf); }

 private:
  void accumulate(Tensor& grad, Tensor& incoming);

  std::weak_ptr<TensorImpl> leaf_;
  std::mutex mutex_;
  std::vector<std::pair<HookHandle, PostAccumulateGradHook>> post_hooks_;
};

struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;                     // set for non-leaves
  uint32_t output_nr = 0;                            // which output of grad_fn
  std::shared_ptr<AccumulateGrad> grad_accumulator;  // set for leaves requiring grad
};

HookHandle next_hook_handle();

// The edge along which a gradient for `t` flows: its grad_fn, its accumulator (a leaf
// requiring grad), or none.
Edge gradient_edge(const Tensor& t);

// --- recording ----------------------------------------------------------------------

inline bool any_requires_grad() { return false; }
template <class... Ts>
bool any_requires_grad(const Tensor& first, const Ts&... rest) {
  return GradMode::is_enabled() && ((first.defined() && first.requires_grad()) || ... ||
                                    (rest.defined() && rest.requires_grad()));
}
bool any_requires_grad(std::span<const Tensor> tensors);

template <class F, class... Ts>
std::shared_ptr<Node> make_node(const char* name, F&& backward, const Ts&... inputs) {
  auto node = std::make_shared<LambdaNode<std::decay_t<F>>>(name, std::forward<F>(backward));
  node->reserve_edges(sizeof...(inputs));
  (node->add_next_edge(gradient_edge(inputs)), ...);
  return node;
}

template <class F>
std::shared_ptr<Node> make_node(const char* name, F&& backward, std::span<const Tensor> inputs) {
  auto node = std::make_shared<LambdaNode<std::decay_t<F>>>(name, std::forward<F>(backward));
  node->reserve_edges(inputs.size());
  for (const Tensor& t : inputs) node->add_next_edge(gradient_edge(t));
  return node;
}

// Makes `out` the next output of `node`.
void set_history(const Tensor& out, const std::shared_ptr<Node>& node);

// A tensor kept for backward. Remembers the storage version at save time and refuses to
// hand back a tensor that an in-place op has changed since. An op's own output is saved
// detached, so the node does not own the tensor that owns the node.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output = false);
  const Tensor& unpack() const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint32_t version_ = 0;
};

// --- in-place ops under autograd ----------------------------------------------------

// Throws if an in-place op on `self` cannot be recorded: a leaf that requires grad, or a
// view (weft does not rebase the history of a view's base).
void check_inplace(const Tensor& self, const char* op);
// Writes `result` (computed out of place from self.clone()) into self, bumps self's
// version and moves self's history onto result's node.
const Tensor& commit_inplace(const Tensor& self, const Tensor& result, const char* op);

// --- the engine (core/engine.cpp) ---------------------------------------------------

void run_backward(std::span<const Tensor> roots, std::span<const Tensor> grad_roots, bool retain_graph);

// Runs `callback` once the backward pass running on this thread has run every node (before
// backward() returns; PyTorch's Engine::queue_callback). DDP's reducer queues one from its
// first gradient hook to wait for its buckets. Callbacks run in the order queued; one may
// queue another. Outside a backward pass it is an error.
void queue_backward_callback(std::function<void()> callback);
bool in_backward();

}  // namespace weft
