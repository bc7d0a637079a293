// The ring all-reduce over send and recv; see ring_allreduce.h.
#include "parallel/process_group/ring_allreduce.h"

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "parallel/process_group/collective_support.h"
#include "parallel/process_group/work_queue.h"

namespace weft::parallel {

namespace {

// acc <- acc op incoming, elementwise, in place. float16 and bfloat16 compute in float32 and
// round once, as the Gloo backend's loops do (process_group_gloo.cpp): the same bits.
void reduce_into(const Tensor& acc, const Tensor& incoming, ReduceOp op) {
  if (is_half_precision(acc.dtype())) {
    const Tensor wide = acc.to(DType::Float32);
    reduce_into(wide, incoming.to(DType::Float32), op);
    acc.copy_(wide);
    return;
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: add_(acc, incoming); return;
    case ReduceOp::Product: mul_(acc, incoming); return;
    case ReduceOp::Max: acc.copy_(maximum(acc, incoming)); return;
    case ReduceOp::Min: acc.copy_(minimum(acc, incoming)); return;
  }
}

// Tags of ring messages: above what users pick for their own sends (below 2^30), 64 calls'
// worth of 2^24 tags each, reused in turn (a call finishes before the 64th after it starts).
constexpr int kTagBase = 1 << 30;
constexpr int kTagsPerCall = 1 << 24;

struct Segment {
  int64_t begin = 0, size = 0;
};

}  // namespace

void ring_all_reduce(ProcessGroup& group, const Tensor& tensor, ReduceOp op, const RingOptions& options) {
  WEFT_CHECK(tensor.defined(), "ring_all_reduce: the tensor is undefined");
  WEFT_CHECK(tensor.dtype() != DType::Bool, "ring_all_reduce: bool tensors are not supported (use the group's all_reduce)");
  WEFT_CHECK(options.chunk_bytes > 0, "ring_all_reduce: chunk_bytes must be positive, got ", options.chunk_bytes);
  detail::check_reduce(tensor.dtype(), op, "ring_all_reduce");
  NoGradGuard no_grad;
  const int n = group.size(), me = group.rank();
  const int64_t round = group.next_round();
  if (n == 1) return;
  const Tensor data = tensor.is_contiguous() ? tensor.detach() : tensor.detach().contiguous();
  const Tensor flat = data.reshape({-1});
  const int64_t numel = flat.numel();
  const int64_t per_segment = (numel + n - 1) / n;
  auto segment = [&](int k) {
    const int64_t begin = std::min(numel, k * per_segment);
    return Segment{begin, std::min(numel, begin + per_segment) - begin};
  };
  const int64_t chunk = std::max<int64_t>(1, options.chunk_bytes / tensor.element_size());
  const int64_t chunks_per_segment = std::max<int64_t>(1, (per_segment + chunk - 1) / chunk);
  WEFT_CHECK(2 * (n - 1) * chunks_per_segment < kTagsPerCall, "ring_all_reduce: ", numel,
             " elements in chunks of ", chunk, " need more messages than one call may tag; raise chunk_bytes");
  const int tag0 = kTagBase + static_cast<int>(round % 64) * kTagsPerCall;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // The chunks of segment k: views of `flat`.
  auto chunks_of = [&](int k) {
    std::vector<Tensor> out;
    const Segment s = segment(k);
    for (int64_t offset = 0; offset < s.size; offset += chunk)
      out.push_back(flat.narrow(0, s.begin + offset, std::min(chunk, s.size - offset)));
    return out;
  };
  auto tag = [&](int step, size_t c) { return tag0 + static_cast<int>(step * chunks_per_segment + static_cast<int64_t>(c)); };

  // Reduce-scatter: after step s, segment (me - s - 1) holds the sum of s + 2 ranks' pieces.
  for (int s = 0; s < n - 1; ++s) {
    const std::vector<Tensor> out = chunks_of((me - s + n) % n), in = chunks_of((me - s - 1 + 2 * n) % n);
    std::vector<Tensor> landed;
    std::vector<std::shared_ptr<Work>> receives, sends;
    for (size_t c = 0; c < in.size(); ++c) {
      landed.push_back(empty_like(in[c]));
      receives.push_back(group.recv(landed.back(), prev, tag(s, c)));
    }
    for (size_t c = 0; c < out.size(); ++c) sends.push_back(group.send(out[c], next, tag(s, c)));
    for (size_t c = 0; c < in.size(); ++c) {
      receives[c]->wait();
      reduce_into(in[c], landed[c], op);  // while the later chunks are still arriving
    }
    for (auto& w : sends) w->wait();
  }
  // All-gather: rank me holds the reduced segment (me + 1); pass them around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const int step = n - 1 + s;
    const std::vector<Tensor> out = chunks_of((me + 1 - s + n) % n), in = chunks_of((me - s + n) % n);
    std::vector<std::shared_ptr<Work>> works;
    for (size_t c = 0; c < in.size(); ++c) works.push_back(group.recv(in[c], prev, tag(step, c)));
    for (size_t c = 0; c < out.size(); ++c) works.push_back(group.send(out[c], next, tag(step, c)));
    for (auto& w : works) w->wait();
  }
  if (op == ReduceOp::Avg) detail::divide_in_place(data, static_cast<double>(n));
  if (!data.is_same(tensor) && data.storage() != tensor.storage()) tensor.detach().copy_(data);
}

namespace {

// A group whose all_reduce is the ring; everything else goes to the group it wraps.
class RingAllReduceGroup final : public ProcessGroup {
 public:
  RingAllReduceGroup(std::shared_ptr<ProcessGroup> inner, RingOptions options)
      : ProcessGroup(inner->rank(), inner->size(), inner->timeout()),
        inner_(std::move(inner)),
        options_(options),
        queue_(std::make_unique<WorkQueue>(inner_->timeout())) {}

  std::string backend_name() const override { return inner_->backend_name() + " (ring all_reduce)"; }
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.dtype() == DType::Bool) return inner_->all_reduce(t, op);  // logical max / min: the backend's
    return queue_->enqueue("ring_all_reduce (rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ")",
                           [this, t, op] { ring_all_reduce(*inner_, t, op, options_); });
  }
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override { return inner_->broadcast(t, root); }
  std::shared_ptr<Work> reduce(const Tensor& t, int root, ReduceOp op) override { return inner_->reduce(t, root, op); }
  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& o, const Tensor& i) override {
    return inner_->all_gather(o, i);
  }
  std::shared_ptr<Work> gather(const std::vector<Tensor>& o, const Tensor& i, int root) override {
    return inner_->gather(o, i, root);
  }
  std::shared_ptr<Work> scatter(const Tensor& o, const std::vector<Tensor>& i, int root) override {
    return inner_->scatter(o, i, root);
  }
  std::shared_ptr<Work> reduce_scatter(const Tensor& o, const std::vector<Tensor>& i, ReduceOp op) override {
    return inner_->reduce_scatter(o, i, op);
  }
  std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& o, const std::vector<Tensor>& i) override {
    return inner_->all_to_all(o, i);
  }
  std::shared_ptr<Work> send(const Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  std::shared_ptr<Work> recv(const Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  std::shared_ptr<Work> barrier() override { return inner_->barrier(); }

 private:
  std::shared_ptr<ProcessGroup> inner_;
  RingOptions options_;
  std::unique_ptr<WorkQueue> queue_;  // destroyed first: its operations use inner_
};

}  // namespace

std::shared_ptr<ProcessGroup> with_ring_all_reduce(std::shared_ptr<ProcessGroup> group, RingOptions options) {
  return std::make_shared<RingAllReduceGroup>(std::move(group), options);
}

}  // namespace weft::parallel
