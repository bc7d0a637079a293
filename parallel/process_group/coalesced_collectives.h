// Collectives over lists of tensors: the list flattened into one buffer per dtype (and device),
// so that a model's hundred parameters cost one message each way instead of a hundred
// (PyTorch's _broadcast_coalesced and utils.average_parameters). They are how replicas are made
// equal: by giving them one replica's values (broadcast_tensors: DDP's start and its buffers, a
// replicated pipeline's stages) or by averaging them (local SGD's model averaging, a pipeline's
// gradients averaged by hand).
//
// Every rank of the group gives the same shapes in the same order: the flattened buffers must
// line up. Each is a collective that every rank of the group calls; over a group of one it
// returns at once. None records autograd.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// Every rank's `params` replaced by their average over `group`: one all-reduce per dtype, the
// parameters on one device. Inside a join (join.h) it is an error: a rank that ran out of
// inputs cannot shadow it.
void average_parameters(const std::vector<Tensor>& params, ProcessGroup& group);

// Every rank's params' gradients (.grad) replaced by their average over `group`, as
// average_parameters does it: data parallelism done by hand, after the backward (what DDP
// does, without overlapping it). Every parameter must have a gradient (an error names the
// first without).
void average_gradients(const std::vector<Tensor>& params, ProcessGroup& group);

// Every rank's `tensors` replaced by rank `root`'s (of `group`): one broadcast per dtype and
// device.
void broadcast_tensors(const std::vector<Tensor>& tensors, ProcessGroup& group, int root);

}  // namespace weft::parallel
