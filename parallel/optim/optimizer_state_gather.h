// An optimizer's state spread over the ranks of a group, put together: each rank holds some
// of the entries (ZeroRedundancyOptimizer's shard of the parameters, a DistributedPipeline's
// stages), and a checkpoint needs all of them in one place.
//
// Every rank describes its entries as text (one all_gather_text: a tensor's dtype, shape and
// key, a scalar's value and key), so that each rank knows every message before any tensor
// moves; then each tensor goes from the rank that holds it to `to` (a send, or with `to`
// unset a broadcast to every rank), in the order of the parameters, each finished before the
// next. Keys are the whole optimizer's (optim/optimizer.h: "<param index>.<name>"; scalars
// without an index are hyperparameters, which the ranks hold alike).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "core/device.h"
#include "nn/optim/optimizer.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// "12.exp_avg" -> {12, "exp_avg"}; a key without a leading index (a hyperparameter) -> nullopt.
std::optional<std::pair<size_t, std::string>> split_state_key(const std::string& key);

// A collective: every rank of `group` calls it with its own entries (`mine`, keys already the
// whole optimizer's) and the same `to`. Returns the union on `to` (on every rank when `to` is
// unset), its tensors on the CPU in the order of their parameters; an empty state elsewhere.
// A rank that found a problem of its own passes it as `problem`: it travels with the
// descriptions, so every rank throws it together instead of leaving the others waiting.
// Tensors travel as `device`'s (the nccl backend moves CUDA tensors only). `who` begins the
// errors ("ZeroRedundancyOptimizer.consolidate_state_dict").
optim::OptimizerState gather_optimizer_state(ProcessGroup& group, const optim::OptimizerState& mine,
                                             std::optional<int> to, Device device, const std::string& who,
                                             const std::string& problem = "");

}  // namespace weft::parallel
