// connect_peers: the pairs of ranks that will exchange messages exchange one first, pair by
// pair in one order on every rank, each message done before the next.
//
//   parallel::connect_peers(group, {{0, 1}, {1, 2}}, Device::cuda(local_rank));
//   ... then the program's own sends and receives between ranks 0 and 1, and 1 and 2
//
// weft's NCCL backend makes the communicators of two ranks at their first send or receive
// between them (one per direction), as PyTorch's does. A communicator made while a kernel of
// another communicator runs on this rank can wait for that kernel, which may wait for a peer
// that waits for this rank: a program of sends and receives over NCCL can hang in its first
// step (Note [Connecting before the first step] in parallel/pipeline/distributed_pipeline.cpp).
// After connect_peers every listed pair's communicators exist, made with nothing in flight.
// DistributedPipeline calls it for the pairs its schedule uses.
//
// Every rank of the group calls it with the same pairs (a rank in no pair returns at once
// after checking them). Gloo connects every pair when the group is made; there it only
// exchanges the messages. Its messages use the tag kConnectPeersTag.
#pragma once

#include <utility>
#include <vector>

#include "core/device.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// The tag of connect_peers' messages: above every pipeline message's, below the ring all-reduce's (2^30 on).
constexpr int kConnectPeersTag = (1 << 30) - 1;

// Each pair (two different ranks of the group, in either order; repeats count once): the lower
// rank sends its rank to the higher, then the higher to the lower, as one-element float32
// tensors on `device`, each waited for on the device before the next message. Throws naming a
// pair outside the group, or a peer that answered with another rank than its own.
void connect_peers(ProcessGroup& group, const std::vector<std::pair<int, int>>& pairs, Device device);

}  // namespace weft::parallel
