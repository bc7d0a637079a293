// comm: moving tensors between the devices of one process (PyTorch's torch.cuda.comm).
//
// The building blocks of DataParallel: broadcast a tensor (or many, coalesced) to several
// devices, sum tensors of several devices onto one, scatter a batch into chunks across
// devices and gather chunks back into one tensor. These are plain data movement: they
// record no autograd history (parallel/local/functions.h has the differentiable forms that
// DataParallel uses). They work on any logical devices of one type, cpu:i or cuda:i.
//
// On CUDA every copy is queued on the destination's current stream, ordered after the
// source's with events (core's cross-device copy), so nothing here waits on the host.
// Sums are taken in a fixed order (index order), so results repeat bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace weft::parallel::comm {

// PyTorch's default bucket for the coalesced forms: 10 MiB.
constexpr int64_t kDefaultBufferBytes = int64_t{10} << 20;

// One tensor per device with `tensor`'s values: the tensor itself where devices[i] is its
// own device, a copy elsewhere. Devices must be distinct and of one type.
std::vector<Tensor> broadcast(const Tensor& tensor, const std::vector<Device>& devices);

// Broadcasts several tensors at once. devices[0] must be the device of every tensor (the
// source); out[0] holds the tensors themselves, out[i] their copies on devices[i], in the
// same order. The tensors are grouped by dtype into buckets of at most buffer_bytes (a
// larger tensor forms a bucket alone), each bucket is flattened and copied once per
// device, and the copies are views of that flat buffer: few large copies instead of many
// small ones.
std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices,
                                                     int64_t buffer_bytes = kDefaultBufferBytes);

// The elementwise sum of tensors of one shape and dtype, on `destination`, added in index
// order. Undefined entries are skipped; at least one must be defined.
Tensor reduce_add(const std::vector<Tensor>& tensors, Device destination);

// inputs[d] is a list of tensors on one device (the same shapes and dtypes in every list):
// out[j] = reduce_add over d of inputs[d][j], on `destination`. Coalesced in buckets as
// broadcast_coalesced does: one flatten, copy and add per bucket and device.
std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs, Device destination,
                                         int64_t buffer_bytes = kDefaultBufferBytes);

// The sizes scatter() cuts a dimension of `size` into across `devices` pieces: chunk()'s
// rule, ceil(size / devices) each, so fewer pieces than devices when size is small
// (5 over 4 devices: 2, 2, 1). The sizes are validated when given; none may be 0.
std::vector<int64_t> scatter_sizes(int64_t size, size_t devices, const std::vector<int64_t>& chunk_sizes = {});

// Cuts `tensor` along `dim` into scatter_sizes() pieces, piece i copied to devices[i]
// (a piece already on its device is a view). Returns one tensor per piece.
std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes = {}, int64_t dim = 0);

// Joins tensors along `dim` on `destination`; every other dim, and the dtype, must match
// (an error names the tensor and both shapes). 0-d tensors are joined as a vector (what
// per-replica scalar losses need), as PyTorch does.
Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim = 0);

}  // namespace weft::parallel::comm
