// Matrix products: rank rules, batch broadcasting, checks, and the backward of each.
//
// Every product reaches the kernel as out[batch..., m, n] = a[batch..., m, k] @
// b[batch..., k, n], with a and b expanded (stride 0) over broadcast batch dims. Views
// only: nothing is copied on the way to the kernel, which reads transposed operands in
// place. A batched a times a 2-d b is folded into one [batch * m, k] x [k, n] product
// when a's batch dims merge with its rows, as PyTorch does: one large GEMM instead of
// many small ones, and in backward one GEMM for grad_b instead of a batch of them and a sum.
#include "kernels/linalg.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/copy.h"
#include "kernels/checks.h"
#include "kernels/elementwise.h"
#include "kernels/linalg_kernels.h"
#include "kernels/reduce.h"

namespace weft {

constinit DispatchStub<MatmulFn> matmul_stub{"matmul"};

namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(a, op, "a");
  check_defined(b, op, "b");
  check_same_device(op, {&a, &b});
  check_same_dtype(op, a, b);
  check_floating(a, op);
}

Shape leading(const Shape& s, int64_t keep) {
  Shape out;
  for (int64_t i = 0; i < keep; ++i) out.push_back(s[i]);
  return out;
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

// Whether dims [0, last] of t can be merged into one without a copy: each dim steps over
// exactly the dims after it (size-1 dims aside). Then t.view() of the merged shape works.
bool merges_into_rows(const Tensor& t, int64_t last) {
  for (int64_t d = 0; d < last; ++d)
    if (t.shape()[d] != 1 && t.strides()[d] != t.strides()[d + 1] * t.shape()[d + 1]) return false;
  return true;
}

// The broadcast batch dims of a [..., m, k] and b [..., k, n]; the error names the
// operands' own shapes.
Shape broadcast_batch(const Tensor& a, const Tensor& b, const char* op, const Tensor& a_orig,
                      const Tensor& b_orig) {
  const Shape batch_a = leading(a.shape(), a.dim() - 2), batch_b = leading(b.shape(), b.dim() - 2);
  const int64_t nb = std::max(batch_a.size(), batch_b.size());
  Shape batch;
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t ia = i - (nb - batch_a.size()), ib = i - (nb - batch_b.size());
    const int64_t da = ia >= 0 ? batch_a[ia] : 1, db = ib >= 0 ? batch_b[ib] : 1;
    WEFT_CHECK(da == db || da == 1 || db == 1, op, ": the batch dims of shapes ", a_orig.shape(), " and ",
               b_orig.shape(), " cannot be broadcast together (", da, " vs ", db, ")");
    batch.push_back(da == 1 ? db : da);
  }
  return batch;
}

// Writes the [batch..., m, n] product of a [..., m, k] and b [..., k, n] (detached,
// k checked) into `result`, a new contiguous tensor with those elements.
void product_into(const Tensor& a, const Tensor& b, const Shape& batch, const Tensor& result) {
  if (result.numel() == 0) return;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (b.dim() == 2 && a.dim() > 2 && merges_into_rows(a, a.dim() - 2)) {
    const int64_t rows = batch.numel() * m;
    matmul_stub(a.device(), a.view({rows, k}), b, result.view({rows, n}), false);
  } else {
    matmul_stub(a.device(), a.expand(with_matrix(batch, m, k)), b.expand(with_matrix(batch, k, n)),
                result.view(with_matrix(batch, m, n)), false);
  }
}

[[noreturn]] void fail_inner(const char* op, const Tensor& a, const Tensor& b, int64_t ka, int64_t kb) {
  WEFT_FAIL(op, ": shapes ", a.shape(), " and ", b.shape(), " cannot be multiplied (", ka, " != ", kb, ")");
}

// Gradients of matmul for operands of any rank (see matmul's rank rules).
GradList matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  if (a.dim() == 1 && b.dim() == 1)
    return {need_a ? mul(g, b) : Tensor(), need_b ? mul(g, a) : Tensor()};
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  Tensor g2 = g;
  if (a.dim() == 1) g2 = g2.unsqueeze(-2);
  if (b.dim() == 1) g2 = g2.unsqueeze(-1);
  Tensor da, db;
  if (need_a) da = sum_to_shape(matmul(g2, b2.transpose(-1, -2)), a2.shape()).reshape(a.shape());
  if (need_b) {
    if (b2.dim() == 2 && a2.dim() > 2) {
      // sum over the batch of a_i^T g_i is one product of the stacked rows.
      const int64_t rows = leading(a2.shape(), a2.dim() - 1).numel();
      db = matmul(a2.reshape({rows, a2.size(-1)}).t(), g2.reshape({rows, g2.size(-1)}));
    } else {
      db = sum_to_shape(matmul(a2.transpose(-1, -2), g2), b2.shape());
    }
    db = db.reshape(b.shape());
  }
  return {da, db};
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands("matmul", a, b);
  WEFT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes ",
             a.shape(), " and ", b.shape());
  const Tensor a2 = a.dim() == 1 ? a.detach().unsqueeze(0) : a.detach();
  const Tensor b2 = b.dim() == 1 ? b.detach().unsqueeze(1) : b.detach();
  if (a2.size(-1) != b2.size(-2)) fail_inner("matmul", a, b, a2.size(-1), b2.size(-2));

  // The result drops the 1 that a 1-d operand gained.
  const Shape batch = broadcast_batch(a2, b2, "matmul", a, b);
  Shape shape = batch;
  if (a.dim() > 1) shape.push_back(a2.size(-2));
  if (b.dim() > 1) shape.push_back(b2.size(-1));
  Tensor out = empty(shape, TensorOptions(a.dtype(), a.device()));
  product_into(a2, b2, batch, out);
  if (any_requires_grad(a, b)) {
    set_history(out, make_node(
                         "MatmulBackward",
                         [sa = SavedTensor(a), sb = SavedTensor(b), ga = a.requires_grad(),
                          gb = b.requires_grad()](const GradList& g) -> GradList {
                           return matmul_backward(g[0], sa.unpack(), sb.unpack(), ga, gb);
                         },
                         a, b));
  }
  return out;
}

Tensor mm(const Tensor& a, const Tensor& b) {
  check_defined(a, "mm", "a");
  check_defined(b, "mm", "b");
  check_dim(a, 2, "mm", "a");
  check_dim(b, 2, "mm", "b");
  if (a.size(1) != b.size(0)) fail_inner("mm", a, b, a.size(1), b.size(0));
  return matmul(a, b);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_defined(a, "bmm", "a");
  check_defined(b, "bmm", "b");
  check_dim(a, 3, "bmm", "a");
  check_dim(b, 3, "bmm", "b");
  WEFT_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ, shapes ", a.shape(), " and ", b.shape(),
             " (bmm does not broadcast; matmul does)");
  if (a.size(2) != b.size(1)) fail_inner("bmm", a, b, a.size(2), b.size(1));
  return matmul(a, b);
}

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  check_defined(input, "linear", "input");
  check_defined(weight, "linear", "weight");
  check_dim(weight, 2, "linear", "weight");
  WEFT_CHECK(input.dim() >= 1, "linear: expected 'input' to have at least 1 dimension, got shape ", input.shape());
  const int64_t in_features = weight.size(1), out_features = weight.size(0);
  WEFT_CHECK(input.size(-1) == in_features, "linear: input shape ", input.shape(), " and weight shape ",
             weight.shape(), " do not match (input's last dim ", input.size(-1), " != in_features ", in_features,
             ")");
  if (bias.defined()) {
    check_same_device("linear", {&input, &weight, &bias});
    check_same_dtype("linear", input, bias);
    WEFT_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: expected bias of shape [", out_features,
               "] for weight shape ", weight.shape(), ", got ", bias.shape());
  } else {
    check_same_device("linear", {&input, &weight});
  }
  check_same_dtype("linear", input, weight);
  check_floating(input, "linear");

  // input as rows [rows, in]; a copy only when its leading dims cannot merge.
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < input.dim(); ++d) rows *= input.size(d);
  Tensor x = input.detach();
  x = input.dim() == 1 ? x.unsqueeze(0) : (merges_into_rows(x, x.dim() - 2) ? x : x.contiguous());
  Shape shape = input.shape();
  shape[shape.size() - 1] = out_features;
  Tensor out = empty(shape, TensorOptions(input.dtype(), input.device()));
  if (out.numel() > 0) {
    Tensor rows_in = x.view({rows, in_features}), rows_out = out.view({rows, out_features});
    if (bias.defined()) copy_values(rows_out, bias.detach());
    matmul_stub(input.device(), rows_in, weight.detach().t(), rows_out, bias.defined());
  }

  if (any_requires_grad(input, weight, bias)) {
    set_history(out, make_node(
                         "LinearBackward",
                         [sx = SavedTensor(input), sw = SavedTensor(weight), gx = input.requires_grad(),
                          gw = weight.requires_grad(), gb = bias.defined() && bias.requires_grad(), rows,
                          in_features, out_features](const GradList& g) -> GradList {
                           const Tensor g2 = g[0].reshape({rows, out_features});
                           const Tensor& x = sx.unpack();
                           // weight [out, in] is used as stored: g @ W needs no transpose.
                           return {gx ? matmul(g2, sw.unpack()).reshape(x.shape()) : Tensor(),
                                   gw ? matmul(g2.t(), x.reshape({rows, in_features})) : Tensor(),
                                   gb ? sum(g2, {0}) : Tensor()};
                         },
                         input, weight, bias));
  }
  return out;
}

}  // namespace weft
