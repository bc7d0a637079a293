// clip_grad_norm_: one multi-tensor norm kernel call and at most one scale call per
// (device, dtype) group of gradients.
//
// Note [Norms over several devices]: each group's kernel returns its partial sum of
// |g|^p in float64 (max |g| for the inf-norm), and the partials are combined on the
// host, in group order (the order the (device, dtype) pairs first appear in `params`).
// That is PyTorch's "norm of the per-device norms" (sum_d n_d^p)^(1/p) without taking
// each root and raising it back to p, which would add two roundings per device. The
// result is deterministic; it equals the one-device norm up to the reassociation of a
// float64 sum (the kernels sum in fixed blocks of the concatenated gradients), not
// bitwise.
#include "nn/optim/clip_grad.h"

#include <cmath>
#include <utility>

#include "core/autograd.h"
#include "kernels/elementwise.h"
#include "kernels/optim_kernels.h"

namespace weft::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
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
  if (groups.empty()) return 0.0;

  // Note [Norms over several devices].
  const bool is_inf = std::isinf(norm_type);
  double accumulated = 0;
  for (const Group& group : groups) {
    double part = norm_power_sum_stub(group.device, group.readable, norm_type);
    accumulated = is_inf ? ((std::isnan(part) || part > accumulated) ? part : accumulated) : accumulated + part;
  }
  double total =
      is_inf ? accumulated : (norm_type == 2 ? std::sqrt(accumulated) : std::pow(accumulated, 1 / norm_type));
  WEFT_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm of order ", norm_type,
             " of the gradients is ", total,
             " (non-finite), so they cannot be clipped; set error_if_nonfinite=false "
             "to skip this check");

  double clip_coef = max_norm / (total + 1e-6);
  if (!(clip_coef < 1)) return total;
  for (const Group& group : groups) {
    std::vector<Tensor> contiguous;
    for (const Tensor& g : group.grads) {
      if (g.is_contiguous())
        contiguous.push_back(g);
      else
        mul_(g, clip_coef);
    }
    multi_tensor_scale_stub(group.device, contiguous, clip_coef);
    for (const Tensor& g : contiguous) g.bump_version();
  }
  return total;
}

}  // namespace weft::optim
