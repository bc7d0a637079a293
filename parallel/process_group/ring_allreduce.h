// The ring all-reduce, written out: the algorithm NCCL and Gloo run for large tensors, on
// nothing but a process group's send and recv.
//
// n ranks sit on a ring, each sending to the next and receiving from the previous. The
// tensor is cut into n segments. Reduce-scatter: in step s (0 .. n-2) rank r sends segment
// (r - s) mod n and receives segment (r - s - 1) mod n, which it reduces into its own copy;
// after n - 1 steps rank r holds segment (r + 1) mod n reduced over every rank. All-gather:
// n - 1 more steps pass the reduced segments around the ring, each rank copying what it
// receives. Every rank sends and receives 2 (n - 1) / n of the tensor in all, whatever n
// is: that is why the ring is bandwidth-optimal, and why nccl-tests' "bus bandwidth" is
// algbw * 2 (n - 1) / n.
//
// Each segment travels in chunks of at most chunk_bytes: all of a step's sends and receives
// are posted at once, and a chunk is reduced as soon as it has arrived, while the next ones
// are still on the wire (the pipelining that keeps the links busy).
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/process_group/process_group.h"

namespace weft::parallel {

struct RingOptions {
  int64_t chunk_bytes = int64_t{1} << 20;
};

// tensor <- op over every rank of `group` (in place, blocking). Any device whose tensors the
// group can send (CPU with Gloo); every rank passes the same shape and dtype (not bool).
void ring_all_reduce(ProcessGroup& group, const Tensor& tensor, ReduceOp op = ReduceOp::Sum,
                     const RingOptions& options = {});

// `group` with its all_reduce done by ring_all_reduce (queued, with a Work handle), bool
// tensors excepted; every other operation is the group's own. new_group_from_store applies it when
// WEFT_ALL_REDUCE=ring.
std::shared_ptr<ProcessGroup> with_ring_all_reduce(std::shared_ptr<ProcessGroup> group, RingOptions options = {});

}  // namespace weft::parallel
