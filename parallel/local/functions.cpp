// broadcast, scatter and gather with their backward nodes; see functions.h.
#include "parallel/local/functions.h"

#include "core/autograd.h"
#include "core/error.h"

namespace weft::parallel {

std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors, const std::vector<Device>& devices,
                                           int64_t buffer_bytes) {
  std::vector<std::vector<Tensor>> out = comm::broadcast_coalesced(tensors, devices, buffer_bytes);
  std::vector<Tensor> inputs;  // those that need a gradient, in order
  std::vector<size_t> index;   // their positions in `tensors`
  for (size_t j = 0; j < tensors.size(); ++j)
    if (any_requires_grad(tensors[j])) {
      inputs.push_back(tensors[j]);
      index.push_back(j);
    }
  if (inputs.empty()) return out;
  auto node = make_node(
      "BroadcastBackward",
      [devices, k = inputs.size(), buffer_bytes](const GradList& grads) -> GradList {
        // grads[d * k + j]: the gradient of input j's copy on devices[d].
        std::vector<std::vector<Tensor>> per_device(devices.size());
        for (size_t d = 0; d < devices.size(); ++d)
          per_device[d].assign(grads.begin() + static_cast<std::ptrdiff_t>(d * k),
                               grads.begin() + static_cast<std::ptrdiff_t>((d + 1) * k));
        return comm::reduce_add_coalesced(per_device, devices[0], buffer_bytes);
      },
      std::span<const Tensor>(inputs));
  for (size_t d = 0; d < devices.size(); ++d)
    for (size_t j : index) set_history(out[d][j], node);
  return out;
}

std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes, int64_t dim) {
  std::vector<Tensor> out = comm::scatter(tensor, devices, chunk_sizes, dim);
  if (!any_requires_grad(tensor)) return out;
  auto node = make_node(
      "ScatterBackward",
      [source = tensor.device(), dim](const GradList& grads) -> GradList { return {comm::gather(grads, source, dim)}; },
      tensor);
  for (const Tensor& t : out) set_history(t, node);
  return out;
}

Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim) {
  Tensor out = comm::gather(tensors, destination, dim);
  if (!any_requires_grad(std::span<const Tensor>(tensors))) return out;
  // Where each input's slice of the gradient goes back to.
  std::vector<int64_t> sizes;
  std::vector<Device> devices;
  std::vector<bool> scalar;
  for (const Tensor& t : tensors) {
    scalar.push_back(t.dim() == 0);
    sizes.push_back(t.dim() == 0 ? 1 : t.size(wrap_dim(dim, t.dim(), "gather")));
    devices.push_back(t.device());
  }
  auto node = make_node(
      "GatherBackward",
      [sizes, devices, scalar, dim](const GradList& grads) -> GradList {
        const Tensor& g = grads[0];
        const int64_t d = scalar[0] ? 0 : wrap_dim(dim, g.dim(), "gather");
        GradList out;
        int64_t offset = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          Tensor piece = g.narrow(d, offset, sizes[i]);
          if (scalar[i]) piece = piece.reshape({});
          out.push_back(piece.device() == devices[i] ? piece.contiguous() : piece.to(devices[i]));
          offset += sizes[i];
        }
        return out;
      },
      std::span<const Tensor>(tensors));
  set_history(out, node);
  return out;
}

}  // namespace weft::parallel
