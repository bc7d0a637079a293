// replicate: copies of a module on several devices whose gradients flow back to it
// (PyTorch's torch.nn.parallel.replicate).
//
// Replica i lives on devices[i]. Its parameters are the outputs of one differentiable,
// coalesced broadcast (parallel/local/functions.h) from devices[0], where the module must live:
// backward through any replica accumulates into the module's own parameters' .grad, summed
// over the replicas in device order. Buffers are copied without gradient, and replica 0
// holds the module's own buffers, so that in-place updates there (BatchNorm's running
// statistics) persist in the module, as in PyTorch; the other replicas' buffer updates are
// lost with the replicas. Replicas are built fresh for each forward (they are cheap:
// shallow copies around the broadcast tensors, nn::Module::replica).
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "nn/module.h"

namespace weft::parallel {

// With detach (or grad mode off), the parameters are plain copies and record nothing.
std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module, const std::vector<Device>& devices,
                                                   bool detach = false);

}  // namespace weft::parallel
