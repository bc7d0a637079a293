// The backward engine: one host thread, a deterministic order.
//
// Note [Execution order]: backward first counts, for every node reachable from the
// roots, how many edges point at it. A node becomes ready when all of them have
// delivered; among ready nodes the one with the highest sequence_nr runs first. Nodes are
// numbered per thread, in creation order, so on one thread this is "latest-created
// first", except that a leaf's AccumulateGrad, which has the highest number of all, runs
// as soon as its gradient is complete (so DDP's hooks fire, and its all-reduces start,
// while backward goes on). That is a valid reverse topological order, the same on every
// run and on every rank, which DDP relies on (all ranks fire their gradient hooks, and so
// fill their buckets, in the same order). Threads that build a graph together (fork_join:
// parallel_apply's replicas, pipeline stages) start from their parent's number and the
// parent continues after the furthest of them, so the order still depends only on what
// each thread did, never on how the threads interleaved; ties (between such threads, and
// between AccumulateGrads) are broken by the ready queue (a binary heap), deterministically,
// since this single thread pushes the same nodes in the same order on every run. Several
// backward passes may run at once on different threads over different graphs. CUDA work
// is asynchronous, so one host thread still keeps every device busy.
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/autograd.h"
#include "core/gradient_ops.h"

namespace weft {

namespace {

struct LaterFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

void check_gradient(const Node& producer, size_t input, const Tensor& grad, const OutputMeta& expected) {
  WEFT_CHECK(grad.shape() == expected.shape && grad.dtype() == expected.dtype && grad.device() == expected.device,
             "backward: ", producer.name(), " returned a gradient of shape ", grad.shape(), " ", grad.dtype(), " on ",
             grad.device(), " for input ", input, ", which is ", expected.shape, " ", expected.dtype, " on ",
             expected.device);
}

// The callbacks of the backward pass running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* backward_callbacks = nullptr;

}  // namespace

void queue_backward_callback(std::function<void()> callback) {
  WEFT_CHECK(backward_callbacks != nullptr, "queue_backward_callback: no backward pass is running on this thread");
  backward_callbacks->push_back(std::move(callback));
}

bool in_backward() { return backward_callbacks != nullptr; }

void run_backward(std::span<const Tensor> roots, std::span<const Tensor> grad_roots, bool retain_graph) {
  WEFT_CHECK(roots.size() == grad_roots.size(), "backward: ", roots.size(), " outputs but ", grad_roots.size(),
             " gradients");
  NoGradGuard no_grad;
  // A backward pass inside a hook of another has callbacks of its own.
  std::vector<std::function<void()>> callbacks;
  struct Restore {
    std::vector<std::function<void()>>* previous;
    ~Restore() { backward_callbacks = previous; }
  } restore{backward_callbacks};
  backward_callbacks = &callbacks;

  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, GradList> buffers;
  auto deliver = [&](const Edge& edge, Tensor grad) {
    GradList& buffer = buffers[edge.node.get()];
    if (buffer.empty()) buffer.resize(edge.node->num_outputs());
    Tensor& slot = buffer[edge.input_nr];
    slot = slot.defined() ? gradient_ops().add(slot, grad) : std::move(grad);
  };

  // Count dependencies over everything reachable from the roots.
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    Edge edge = gradient_edge(roots[i]);
    WEFT_CHECK(edge.node != nullptr, "backward: output ", i, " does not require grad");
    check_gradient(*edge.node, i, grad_roots[i], edge.node->output_meta(edge.input_nr));
    if (seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
    root_edges.push_back(std::move(edge));
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges()) {
      if (!next.node) continue;
      ++dependencies[next.node.get()];
      if (seen.insert(next.node.get()).second) stack.push_back(next.node.get());
    }
  }

  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, LaterFirst> ready;
  for (size_t i = 0; i < roots.size(); ++i) deliver(root_edges[i], grad_roots[i]);
  for (const Edge& edge : root_edges) {
    if (dependencies[edge.node.get()] == 0) {
      dependencies[edge.node.get()] = -1;  // queued once, even if it is several roots
      ready.push(edge.node);
    }
  }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    GradList grads;
    if (auto it = buffers.find(node.get()); it != buffers.end()) {
      grads = std::move(it->second);
      buffers.erase(it);
    }
    bool any_defined = false;
    for (const Tensor& g : grads) any_defined |= g.defined();

    if (any_defined) {
      // Outputs that received nothing get zeros, so a backward function always sees a
      // full, correctly shaped set of gradients.
      for (size_t i = 0; i < node->num_outputs(); ++i) {
        const OutputMeta& meta = node->output_meta(i);
        if (!grads[i].defined()) grads[i] = zeros(meta.shape, TensorOptions(meta.dtype, meta.device));
        node->run_pre_hooks(static_cast<uint32_t>(i), grads[i]);
      }
      GradList input_grads = node->apply(std::move(grads));
      if (!retain_graph) node->release_saved();
      const auto& edges = node->next_edges();
      WEFT_CHECK(input_grads.size() == edges.size() || edges.empty(), "backward: ", node->name(), " returned ",
                 input_grads.size(), " gradients for ", edges.size(), " inputs");
      for (size_t i = 0; i < edges.size(); ++i) {
        if (!edges[i].node || !input_grads[i].defined()) continue;
        check_gradient(*node, i, input_grads[i], edges[i].node->output_meta(edges[i].input_nr));
        deliver(edges[i], std::move(input_grads[i]));
      }
    } else if (!retain_graph) {
      node->release_saved();
    }
    // Children become ready whether or not this node produced anything for them.
    for (const Edge& next : node->next_edges()) {
      if (next.node && --dependencies[next.node.get()] == 0) ready.push(next.node);
    }
  }
  // Callbacks last: every node has run. Index-based, since a callback may queue more.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto callback = std::move(callbacks[i]);
    callback();
  }
}

}  // namespace weft
