// The communication hooks that come with DistributedDataParallel (PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.default_hooks; PowerSGD's is in
// parallel/ddp/powersgd_hook.h). Register one before the first backward:
//
//   ddp->register_comm_hook(parallel::fp16_compress_hook());
//
// allreduce_hook: each bucket averaged by one all_reduce; what DDP does without a hook.
// fp16_compress_hook and bf16_compress_hook: each bucket divided by the number of ranks,
// rounded to float16 (11 significant bits, largest 65504) or bfloat16 (8 significant bits,
// float32's range), summed across the ranks in that type, and widened back into the bucket
// once the sum is in. Half the bytes cross the wire; the price is the gradients' rounding,
// and for float16 its range: gradients below 2^-24 become zero and above 65504 infinity (a
// gradient scaler's job; bfloat16 has neither problem, with three fewer bits).
//
// Where weft differs from PyTorch: the division by the number of ranks comes before the
// rounding, in the bucket's own precision (PyTorch rounds first and divides in 16 bits), so
// it costs no 16-bit rounding, and a gradient whose average fits float16 survives even if
// it does not fit itself.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// One bucket as a hook sees it (PyTorch's GradBucket).
struct GradBucket {
  size_t index = 0;               // its place in the order buckets are launched (0 first)
  bool is_last = false;           // the last bucket of this backward
  Tensor buffer;                  // flat: this rank's gradients, where the hook leaves their average
  std::vector<Tensor> gradients;  // views of `buffer`, one per parameter, shaped like it
};

// What a bucket's communication does: given the group and the bucket, start an operation
// that leaves the buffer holding the average over ranks, done when its Work is (PyTorch's
// register_comm_hook). The Reducer calls it once per bucket and backward, in bucket order,
// on every rank, and waits for the buckets' Works in that order. Buckets are rebuilt once,
// after the first iteration (parallel/ddp/reducer.h): a hook that keeps state per bucket index
// starts keeping it after that.
using CommHook = std::function<std::shared_ptr<Work>(ProcessGroup& group, const GradBucket& bucket)>;

CommHook allreduce_hook();
CommHook fp16_compress_hook();
CommHook bf16_compress_hook();

}  // namespace weft::parallel
