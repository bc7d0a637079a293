// The NCCL backend of ProcessGroup: collectives on CUDA tensors (what PyTorch uses for CUDA
// tensors too), through kernels/device_communicator.h.
//
// Ordering: every operation runs on a communication stream of its device, after an event
// recorded on the caller's current stream (so it sees the tensors as the caller left them),
// and its tensors are recorded on that stream (their memory is not reused before it is
// done). Work::wait() makes the caller's current stream wait for the operation: the host
// does not block, as with PyTorch's NCCL backend; reading a result on the host (item(),
// to(kCPU)) waits as any copy does. barrier()'s wait() blocks the host until every rank
// has arrived.
//
// Communicators are made on first use: one per device for collectives (rank 0 makes its id
// and hands it over through the store), and one per direction between two ranks for send
// and recv (the sender makes it), each with a stream of its own, so that a rank's sends to a
// peer and its receives from it never wait for each other (NCCL's sends block their stream
// until the receive is there). A direction's communicator is connected, and the messages
// asked for meanwhile queued, by a thread of its own: the first send of every rank of a ring
// waits for the next rank, which is itself busy connecting to the one after; the callers
// never block on it. Later messages are queued by the caller (Note [Sends and receives on
// the caller's thread] in the .cpp). A send's or receive's wait() blocks the host only until
// it is queued. Messages between two ranks match in the order they were sent; tags are
// checked to be non-negative and otherwise not used. Connecting waits at least a minute for the peers, whatever the
// group's timeout.
//
// Failures: a watchdog thread looks at the operations in flight every 100 ms. One not done
// after the group's timeout (counted from when it was queued: the time its communicator took
// to connect does not count; one not queued yet fails after the connection's bound, a minute
// or the timeout if longer), an error NCCL reports (a peer gone), or an operation that could
// not be queued, aborts every communicator of the group, so that no stream waits for ever,
// and is reported on stderr naming the operation and the rank. Then the process ends with
// exit status 1 (results may already be garbage; PyTorch tears the process down too), which
// makes weft-run stop the other ranks. With WEFT_NCCL_ASYNC_ERROR_HANDLING=0 the process goes on instead, and every
// later wait() and operation of the group throws the error.
//
// Dtypes: float32, float64, float16, bfloat16, int64, int32, uint8, and bool (as uint8) for max
// and min.
#pragma once

#include <chrono>
#include <memory>

#include "parallel/process_group/process_group.h"
#include "parallel/store/store.h"

namespace weft::parallel {

// Whether weft was built with NCCL and a GPU is there.
bool nccl_available();

// This rank's member of an NCCL group of `size` ranks that meet through `store` (a store,
// or a PrefixStore, of this group alone). Communicators are made when first needed.
std::shared_ptr<ProcessGroup> new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                             std::chrono::milliseconds timeout);

}  // namespace weft::parallel
