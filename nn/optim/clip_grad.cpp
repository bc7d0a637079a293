// clip_grad_norm_: one multi-tensor norm kernel call and one scale call per (device,
// dtype) group of gradients, with no host synchronisation (unless error_if_nonfinite).
//
// Note [Norms over several devices]: each group's kernel leaves its partial sum of |g|^p
// in float64 (max |g| for the inf-norm) in a one-element tensor on its device; the
// partials are copied to the first group's device (device-to-device copies, ordered with
// events, not through the host) and combined there in group order (the order the
// (device, dtype) pairs first appear in `params`). That is PyTorch's "norm of the
// per-device norms" (sum_d n_d^p)^(1/p) without taking each root and raising it back to
// p, which would add two roundings per device. The result is deterministic; it equals the
// one-device norm up to the reassociation of a float64 sum (the kernels sum in fixed
// blocks of the concatenated gradients), not bitwise. The total is copied back to each
// group's device, where the scale kernel computes the clipping factor from it.
#include "nn/optim/clip_grad.h"

#include <cmath>
#include <utility>

#include "core/autograd.h"
#include "core/copy.h"
#include "kernels/elementwise.h"
#include "kernels/optim_kernels.h"

namespace weft::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  WEFT_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  WEFT_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 or INFINITY, got ", norm_type);
  NoGradGuard no_grad;

  // Groups of gradients that one kernel call can take: one device, one dtype.
  struct Group {
    Device device;
    DType dtype;
    std::vector<Tensor> grads;     // as stored in .grad
    std::vector<Tensor> readable;  // contiguous (a copy of a strided grad)
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_CHECK(params[i].defined(), "clip_grad_norm_: parameter ", i, " is an undefined tensor");
    const Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    Group* group = nullptr;
    for (Group& candidate : groups)
      if (candidate.device == g.device() && candidate.dtype == g.dtype()) group = &candidate;
    if (!group) group = &groups.emplace_back(Group{g.device(), g.dtype(), {}, {}});
    group->grads.push_back(g);
    group->readable.push_back(g.contiguous());
  }
  if (groups.empty()) return zeros({}, DType::Float64);

  // Note [Norms over several devices].
  const Device home = groups[0].device;
  const bool is_inf = std::isinf(norm_type);
  Tensor accumulated;
  for (const Group& group : groups) {
    Tensor part = empty({1}, TensorOptions(DType::Float64, group.device));
    norm_power_sum_stub(group.device, group.readable, norm_type, part);
    part = part.to(home);
    if (!accumulated.defined()) accumulated = part;
    else accumulated = is_inf ? maximum(accumulated, part) : add(accumulated, part);
  }
  const Tensor total = is_inf ? accumulated : norm_type == 2 ? sqrt(accumulated) : pow(accumulated, 1 / norm_type);
  if (error_if_nonfinite) {
    const double value = total.item();  // the one host read: the check needs the value before anything is scaled
    WEFT_CHECK(std::isfinite(value), "clip_grad_norm_: the total norm of order ", norm_type,
               " of the gradients is ", value,
               " (non-finite), so they cannot be clipped; set error_if_nonfinite=false "
               "to skip this check");
  }

  for (const Group& group : groups) {
    clip_scale_stub(group.device, group.readable, total.to(group.device), max_norm);
    for (size_t i = 0; i < group.grads.size(); ++i) {
      if (group.grads[i].is_same(group.readable[i])) group.grads[i].bump_version();
      else copy_values(group.grads[i], group.readable[i]);  // a strided grad: its scaled copy back (bumps too)
    }
  }
  return total.view({});
}

}  // namespace weft::optim
