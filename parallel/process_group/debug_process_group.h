// DebugProcessGroup: a ProcessGroup that first checks, across the ranks, that they all
// make the same call (WEFT_DISTRIBUTED_DEBUG=1; PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL).
//
// Ranks that disagree on a collective (one calls all_reduce on 4 floats, another on 5, or
// one calls broadcast while another calls all_reduce) otherwise hang or compute garbage.
// Here every collective first writes its fingerprint (the op, each tensor's dtype and shape,
// the reduce op, the root) to the store under the call's sequence number, waits for every
// rank's, and fails on every rank with both calls named when they differ:
//
//   collective mismatch at call 7 of the group: rank 0 called all_reduce(float32 [4], sum)
//   but rank 1 called all_reduce(float32 [5], sum)
//
// Costs a store round trip per collective: a debugging aid. Sends and receives are not
// checked (they pair two ranks, not the group).
#pragma once

#include <memory>

#include "parallel/process_group/process_group.h"
#include "parallel/store/store.h"

namespace weft::parallel {

// Whether WEFT_DISTRIBUTED_DEBUG asks for the check (1, or DETAIL as PyTorch spells it).
bool distributed_debug_enabled();

// `store` is the group's own (a prefix of no other group).
std::shared_ptr<ProcessGroup> debug_process_group(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store);

}  // namespace weft::parallel
