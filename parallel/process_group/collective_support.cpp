// Checks and staging shared by the process-group backends; see collective_support.h.
#include "parallel/process_group/collective_support.h"

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/shape_ops.h"

namespace weft::parallel::detail {

void check_rank(int r, int size, const char* name, const std::string& what) {
  WEFT_CHECK(r >= 0 && r < size, what, ": ", name, " ", r, " is not a rank of this group (0 .. ", size - 1, ")");
}

void check_reduce(DType dtype, ReduceOp op, const std::string& what) {
  if (dtype == DType::Bool)
    WEFT_CHECK(op == ReduceOp::Max || op == ReduceOp::Min, what, ": bool tensors reduce with max or min only, not ",
               reduce_op_name(op));
  if (op == ReduceOp::Avg)
    WEFT_CHECK(is_floating(dtype) || is_half_precision(dtype), what, ": avg needs a floating dtype, got ", dtype,
               " (use sum)");
}

void divide_in_place(const Tensor& t, double divisor) {
  NoGradGuard no_grad;
  if (is_half_precision(t.dtype())) {
    t.detach().copy_(div(t.to(DType::Float32), divisor));
  } else {
    div_(t.detach(), divisor);
  }
}

void check_list(const std::vector<Tensor>& list, size_t count, const Tensor& like, const char* name,
                const std::string& what) {
  WEFT_CHECK(list.size() == count, what, ": ", list.size(), " ", name, " given, one per rank (", count, ") expected");
  for (size_t i = 0; i < list.size(); ++i) {
    WEFT_CHECK(list[i].defined() && list[i].device() == like.device(), what, ": ", name, "[", i,
               "] must be a defined tensor on ", like.device());
    WEFT_CHECK(list[i].shape() == like.shape() && list[i].dtype() == like.dtype(), what, ": ", name, "[", i, "] is ",
               list[i].dtype(), " ", list[i].shape(), " but every tensor must be ", like.dtype(), " ", like.shape());
  }
}

Tensor flatten(const std::vector<Tensor>& tensors) {
  NoGradGuard no_grad;
  std::vector<Tensor> pieces;
  for (const Tensor& t : tensors) pieces.push_back(t.detach().reshape({-1}));
  return cat(pieces).contiguous();
}

void unflatten_into(const Tensor& flat, const std::vector<Tensor>& outputs) {
  NoGradGuard no_grad;
  int64_t offset = 0;
  for (const Tensor& out : outputs) {
    out.detach().copy_(flat.narrow(0, offset, out.numel()).view(out.shape()));
    offset += out.numel();
  }
}

Staged::Staged(const Tensor& t) : original_(t), data_(t.is_contiguous() ? t.detach() : t.detach().contiguous()) {}

void Staged::finish() const {
  if (!data_.is_same(original_) && data_.storage() != original_.storage()) {
    NoGradGuard no_grad;
    original_.detach().copy_(data_);
  }
}

}  // namespace weft::parallel::detail
