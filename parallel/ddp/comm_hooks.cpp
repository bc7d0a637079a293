// The built-in communication hooks; see comm_hooks.h.
#include "parallel/ddp/comm_hooks.h"

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"

namespace weft::parallel {

namespace {

CommHook compress_hook(DType wire) {
  return [wire](ProcessGroup& group, const GradBucket& grad_bucket) {
    NoGradGuard no_grad;
    const Tensor& bucket = grad_bucket.buffer;
    Tensor compressed = div(bucket, static_cast<double>(group.size())).to(wire);
    auto work = group.all_reduce(compressed, ReduceOp::Sum);
    // On a CUDA device wait() has ordered the current stream after the all-reduce, so the
    // widening copy is queued behind it without blocking the host.
    return then(std::move(work), [bucket, compressed] { bucket.copy_(compressed); });
  };
}

}  // namespace

CommHook allreduce_hook() {
  return [](ProcessGroup& group, const GradBucket& bucket) {
    return group.all_reduce(bucket.buffer, ReduceOp::Avg);
  };
}

CommHook fp16_compress_hook() { return compress_hook(DType::Float16); }
CommHook bf16_compress_hook() { return compress_hook(DType::BFloat16); }

}  // namespace weft::parallel
