// The Gloo backend of ProcessGroup: collectives on CPU tensors over TCP (what PyTorch uses
// for CPU tensors too), from Debian's libgloo-dev.
//
// The ranks connect to each other in a full mesh of TCP pairs, exchanging addresses through
// the store. Collectives run one at a time, in call order, on a worker thread of the group
// (so every rank runs them in the same order, and the caller overlaps them with its own
// work until Work::wait()); send and recv are issued at once on the caller's thread. Every
// operation is bounded by the group's timeout: a dead or missing peer makes it fail with an
// error, never hang. Tensors must live on the CPU; non-contiguous ones are staged through a
// contiguous copy. Supported dtypes: float32, float64, int64, int32, uint8, and bool for
// everything but sum, product and average.
//
// Built only with Gloo (CMake's WEFT_GLOO); without it new_gloo_group() says so.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/process_group/process_group.h"
#include "parallel/store/store.h"

namespace weft::parallel {

// Whether weft was built with Gloo.
bool gloo_available();

// This rank's member of a Gloo group of `size` ranks that rendezvous through `store` (use
// a store, or a PrefixStore, of this group alone). `bind_host`: the address this rank's
// Gloo pairs listen on and others reach it at (127.0.0.1 on one machine; this host's name
// or address across machines).
std::shared_ptr<ProcessGroup> new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                                             std::chrono::milliseconds timeout, const std::string& bind_host);

}  // namespace weft::parallel
