// Collectives over lists of tensors; see coalesced_collectives.h.
#include "parallel/process_group/coalesced_collectives.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "parallel/process_group/collective_support.h"
#include "parallel/process_group/join.h"

namespace weft::parallel {

void average_parameters(const std::vector<Tensor>& params, ProcessGroup& group) {
  if (params.empty() || group.size() == 1) return;  // a group of one is its own average
  WEFT_CHECK(!join_running(), "average_parameters: a model average cannot run inside a join (a rank that ran out of ",
             "inputs cannot shadow it): average after the join returns");
  NoGradGuard no_grad;
  const Device device = params[0].device();
  std::vector<DType> dtypes;
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_CHECK(params[i].defined(), "average_parameters: parameter ", i, " is undefined");
    WEFT_CHECK(params[i].device() == device, "average_parameters: parameter ", i, " is on ", params[i].device().str(),
               " but parameter 0 on ", device.str(), " (the parameters must share one device)");
    if (std::find(dtypes.begin(), dtypes.end(), params[i].dtype()) == dtypes.end()) dtypes.push_back(params[i].dtype());
  }
  for (DType dtype : dtypes) {
    std::vector<Tensor> same;
    for (const Tensor& p : params)
      if (p.dtype() == dtype) same.push_back(p);
    Tensor flat = detail::flatten(same);
    group.all_reduce(flat, ReduceOp::Avg)->wait();
    detail::unflatten_into(flat, same);
  }
}

void average_gradients(const std::vector<Tensor>& params, ProcessGroup& group) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_CHECK(params[i].grad().defined(), "average_gradients: parameter ", i, " (", params[i].shape().str(),
               ") has no gradient; every rank must average the same gradients, after the backward");
    grads.push_back(params[i].grad());
  }
  average_parameters(grads, group);
}

void broadcast_tensors(const std::vector<Tensor>& tensors, ProcessGroup& group, int root) {
  if (group.size() == 1 || tensors.empty()) return;
  NoGradGuard no_grad;
  // One flat broadcast per (dtype, device): few messages instead of one per tensor.
  std::vector<bool> done(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (done[i]) continue;
    std::vector<Tensor> same;
    for (size_t j = i; j < tensors.size(); ++j)
      if (!done[j] && tensors[j].dtype() == tensors[i].dtype() && tensors[j].device() == tensors[i].device()) {
        same.push_back(tensors[j]);
        done[j] = true;
      }
    Tensor flat = detail::flatten(same);
    group.broadcast(flat, root)->wait();
    detail::unflatten_into(flat, same);
  }
}

}  // namespace weft::parallel
