// comm: broadcast, reduce_add (each also coalesced), scatter and gather; see comm.h.
#include "parallel/local/comm.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/shape_ops.h"

namespace weft::parallel::comm {

namespace {

void check_devices(const std::vector<Device>& devices, const char* op) {
  WEFT_CHECK(!devices.empty(), op, ": no devices given");
  for (size_t i = 0; i < devices.size(); ++i) {
    WEFT_CHECK(devices[i].type == devices[0].type, op, ": devices must be of one type, got ", devices[0], " and ",
               devices[i]);
    for (size_t j = 0; j < i; ++j)
      WEFT_CHECK(devices[j] != devices[i], op, ": device ", devices[i], " is given twice");
  }
}

// Indices of `tensors` in buckets: grouped by dtype (in the order the dtypes first
// appear), in order within a dtype, each bucket at most buffer_bytes unless one tensor
// alone is larger.
std::vector<std::vector<size_t>> take_buckets(const std::vector<Tensor>& tensors, int64_t buffer_bytes) {
  std::vector<DType> dtypes;
  for (const Tensor& t : tensors)
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end()) dtypes.push_back(t.dtype());
  std::vector<std::vector<size_t>> buckets;
  for (DType dtype : dtypes) {
    std::vector<size_t> bucket;
    int64_t bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].dtype() != dtype) continue;
      if (!bucket.empty() && bytes + tensors[i].nbytes() > buffer_bytes) {
        buckets.push_back(std::move(bucket));
        bucket.clear();
        bytes = 0;
      }
      bucket.push_back(i);
      bytes += tensors[i].nbytes();
    }
    if (!bucket.empty()) buckets.push_back(std::move(bucket));
  }
  return buckets;
}

// The bucket's tensors, flattened into one contiguous 1-d tensor on their device.
Tensor flatten_bucket(const std::vector<Tensor>& tensors, const std::vector<size_t>& bucket) {
  std::vector<Tensor> flat;
  flat.reserve(bucket.size());
  for (size_t i : bucket) flat.push_back(tensors[i].reshape({-1}));
  return flat.size() == 1 ? flat[0].contiguous() : cat(flat);
}

// Views of `flat` shaped like the bucket's tensors, written to out[i] for each index i.
void unflatten_bucket(const Tensor& flat, const std::vector<Tensor>& like, const std::vector<size_t>& bucket,
                      std::vector<Tensor>& out) {
  int64_t offset = 0;
  for (size_t i : bucket) {
    const int64_t n = like[i].numel();
    out[i] = flat.narrow(0, offset, n).view(like[i].shape());
    offset += n;
  }
}

std::string shape_text(const Tensor& t) { return t.shape().str(); }

}  // namespace

std::vector<Tensor> broadcast(const Tensor& tensor, const std::vector<Device>& devices) {
  WEFT_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
  check_devices(devices, "broadcast");
  NoGradGuard no_grad;
  const Tensor source = tensor.detach();
  std::vector<Tensor> out;
  out.reserve(devices.size());
  for (Device d : devices) out.push_back(d == source.device() ? source : source.to(d));
  return out;
}

std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices, int64_t buffer_bytes) {
  check_devices(devices, "broadcast_coalesced");
  WEFT_CHECK(buffer_bytes > 0, "broadcast_coalesced: buffer_bytes must be positive, got ", buffer_bytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    WEFT_CHECK(tensors[i].defined(), "broadcast_coalesced: tensor ", i, " is undefined");
    WEFT_CHECK(tensors[i].device() == devices[0], "broadcast_coalesced: tensor ", i, " is on ", tensors[i].device(),
               " but devices[0], the source, is ", devices[0], " (every tensor must be on the source device)");
  }
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> out(devices.size(), std::vector<Tensor>(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) out[0][i] = tensors[i].detach();
  if (devices.size() == 1) return out;
  for (const std::vector<size_t>& bucket : take_buckets(tensors, buffer_bytes)) {
    const Tensor flat = flatten_bucket(out[0], bucket);
    for (size_t d = 1; d < devices.size(); ++d) unflatten_bucket(flat.to(devices[d]), tensors, bucket, out[d]);
  }
  return out;
}

Tensor reduce_add(const std::vector<Tensor>& tensors, Device destination) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors)
    if (t.defined()) {
      first = &t;
      break;
    }
  WEFT_CHECK(first != nullptr, "reduce_add: no tensor to sum (", tensors.size(), " given, none defined)");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    WEFT_CHECK(tensors[i].shape() == first->shape() && tensors[i].dtype() == first->dtype(), "reduce_add: tensor ", i,
               " is ", tensors[i].dtype(), " ", shape_text(tensors[i]), " but the first is ", first->dtype(), " ",
               shape_text(*first));
  }
  NoGradGuard no_grad;
  // A fresh result: to() of a tensor already on the destination would be the tensor.
  Tensor result = first->device() == destination ? first->detach().clone() : first->detach().to(destination);
  for (const Tensor& t : tensors) {
    if (!t.defined() || &t == first) continue;
    add_(result, t.detach().to(destination));
  }
  return result;
}

std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs, Device destination,
                                         int64_t buffer_bytes) {
  WEFT_CHECK(!inputs.empty(), "reduce_add_coalesced: no inputs");
  WEFT_CHECK(buffer_bytes > 0, "reduce_add_coalesced: buffer_bytes must be positive, got ", buffer_bytes);
  const std::vector<Tensor>& like = inputs[0];
  for (size_t d = 0; d < inputs.size(); ++d) {
    WEFT_CHECK(inputs[d].size() == like.size(), "reduce_add_coalesced: list ", d, " has ", inputs[d].size(),
               " tensors but list 0 has ", like.size());
    for (size_t j = 0; j < like.size(); ++j) {
      const Tensor& t = inputs[d][j];
      WEFT_CHECK(t.defined(), "reduce_add_coalesced: tensor ", j, " of list ", d, " is undefined");
      WEFT_CHECK(t.shape() == like[j].shape() && t.dtype() == like[j].dtype(), "reduce_add_coalesced: tensor ", j,
                 " of list ", d, " is ", t.dtype(), " ", shape_text(t), " but in list 0 it is ", like[j].dtype(), " ",
                 shape_text(like[j]));
      WEFT_CHECK(t.device() == inputs[d][0].device(), "reduce_add_coalesced: list ", d, " mixes devices (",
                 inputs[d][0].device(), " and ", t.device(), ")");
    }
  }
  NoGradGuard no_grad;
  std::vector<Tensor> out(like.size());
  for (const std::vector<size_t>& bucket : take_buckets(like, buffer_bytes)) {
    std::vector<Tensor> flats;
    flats.reserve(inputs.size());
    for (const std::vector<Tensor>& list : inputs) flats.push_back(flatten_bucket(list, bucket));
    unflatten_bucket(reduce_add(flats, destination), like, bucket, out);
  }
  return out;
}

std::vector<int64_t> scatter_sizes(int64_t size, size_t devices, const std::vector<int64_t>& chunk_sizes) {
  WEFT_CHECK(devices > 0, "scatter: no devices given");
  WEFT_CHECK(size > 0, "scatter: the dimension to scatter has size ", size, ": there is nothing to scatter");
  if (!chunk_sizes.empty()) {
    WEFT_CHECK(chunk_sizes.size() <= devices, "scatter: ", chunk_sizes.size(), " chunk sizes for ", devices,
               " devices");
    int64_t total = 0;
    for (size_t i = 0; i < chunk_sizes.size(); ++i) {
      WEFT_CHECK(chunk_sizes[i] > 0, "scatter: chunk ", i, " has size ", chunk_sizes[i], " (empty chunks are refused)");
      total += chunk_sizes[i];
    }
    WEFT_CHECK(total == size, "scatter: the chunk sizes sum to ", total, " but the dimension has size ", size);
    return chunk_sizes;
  }
  const int64_t n = static_cast<int64_t>(devices);
  const int64_t chunk = (size + n - 1) / n;
  std::vector<int64_t> sizes;
  for (int64_t offset = 0; offset < size; offset += chunk) sizes.push_back(std::min(chunk, size - offset));
  return sizes;
}

std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes, int64_t dim) {
  WEFT_CHECK(tensor.defined(), "scatter: the tensor is undefined");
  WEFT_CHECK(tensor.dim() > 0, "scatter: cannot scatter a 0-d tensor");
  check_devices(devices, "scatter");
  dim = wrap_dim(dim, tensor.dim(), "scatter");
  NoGradGuard no_grad;
  const Tensor source = tensor.detach();
  std::vector<Tensor> out;
  int64_t offset = 0;
  const std::vector<int64_t> sizes = scatter_sizes(source.size(dim), devices.size(), chunk_sizes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tensor piece = source.narrow(dim, offset, sizes[i]);
    out.push_back(piece.device() == devices[i] ? piece : piece.to(devices[i]));
    offset += sizes[i];
  }
  return out;
}

Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim) {
  WEFT_CHECK(!tensors.empty(), "gather: no tensors to gather");
  for (size_t i = 0; i < tensors.size(); ++i) WEFT_CHECK(tensors[i].defined(), "gather: tensor ", i, " is undefined");
  const Tensor& first = tensors[0];
  const bool scalars = first.dim() == 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    WEFT_CHECK(t.dtype() == first.dtype(), "gather: tensor ", i, " is ", t.dtype(), " but tensor 0 is ", first.dtype());
    WEFT_CHECK(t.dim() == first.dim(), "gather: tensor ", i, " has shape ", shape_text(t), " but tensor 0 has shape ",
               shape_text(first), " (the ranks differ)");
  }
  if (!scalars) dim = wrap_dim(dim, first.dim(), "gather");
  Shape shape = scalars ? Shape{0} : first.shape();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (scalars) {
      ++shape[0];
      continue;
    }
    for (int64_t k = 0; k < t.dim(); ++k)
      WEFT_CHECK(k == dim || t.size(k) == first.size(k), "gather: tensor ", i, " has shape ", shape_text(t),
                 " but tensor 0 has shape ", shape_text(first), " (every dim but dim ", dim, " must match)");
    if (i > 0) shape[dim] += t.size(dim);
  }
  NoGradGuard no_grad;
  Tensor out = empty(shape, TensorOptions(first.dtype(), destination));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const int64_t n = scalars ? 1 : t.size(dim);
    out.narrow(scalars ? 0 : dim, offset, n).copy_(scalars ? t.detach().reshape({1}) : t.detach());
    offset += n;
  }
  return out;
}

}  // namespace weft::parallel::comm
