// parallel_apply: run replica i on inputs[i], all at once, one host thread per device
// (PyTorch's torch.nn.parallel.parallel_apply).
//
// The threads come from fork_join (parallel/local/fork_join.h): each starts with the caller's
// grad mode, current streams (so on CUDA a replica's kernels go to its device's current
// stream) and autograd numbering, and with a share of the CPU threads, so that k logical
// CPU devices computing at once do not oversubscribe the cores. Random ops in a replica
// draw from its device's generator, so results do not depend on the threads' timing. A
// single replica runs on the calling thread.
//
// An exception in any replica is rethrown on the caller once every replica has finished,
// as a weft::Error "in replica i on device d: ..." (the lowest failing i).
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace weft::parallel {

std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs, const std::vector<Device>& devices);

}  // namespace weft::parallel
