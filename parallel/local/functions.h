// The differentiable forms of comm's ops that DataParallel is made of (PyTorch's
// torch/nn/parallel/_functions.py and scatter_gather.py).
//
//   broadcast: tensors on devices[0] -> one copy per device  backward: reduce_add onto devices[0]
//   scatter:   a batch -> chunks on devices                  backward: gather the chunks' gradients
//   gather:    chunks on devices -> one tensor                backward: scatter with the same sizes
//
// Each records one node for all its outputs, so backward meets every device's gradient in
// one place and sums or joins them in a fixed order (results repeat bit for bit). With grad
// mode off, or for inputs that need no gradient, they are comm's plain data movement.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/local/comm.h"

namespace weft::parallel {

// comm::broadcast_coalesced with a gradient: out[d][j] is tensors[j] on devices[d]
// (devices[0] is their device, and out[0][j] aliases tensors[j]); the gradient of
// tensors[j] is the sum over d of the gradients of out[d][j] (reduce_add_coalesced onto
// devices[0]). Outputs of tensors that need no gradient record nothing.
std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors, const std::vector<Device>& devices,
                                           int64_t buffer_bytes = comm::kDefaultBufferBytes);

// comm::scatter with a gradient: the gradient of `tensor` joins the chunks' gradients
// back on its device.
std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes = {}, int64_t dim = 0);

// comm::gather with a gradient: tensor i's gradient is its slice of the output's gradient,
// on tensor i's device (a 0-d tensor gets a 0-d gradient).
Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim = 0);

}  // namespace weft::parallel
