// scaled_dot_product_attention: argument checks, the reference composition, and the fused
// path's [BH, L, E] layout, saved tensors and backward.
#include "kernels/attention.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "kernels/attention_kernels.h"
#include "kernels/checks.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/softmax.h"

namespace weft {

constinit DispatchStub<AttentionForwardFn> attention_forward_stub{"scaled_dot_product_attention"};
constinit DispatchStub<AttentionBackwardFn> attention_backward_stub{"scaled_dot_product_attention_backward"};

namespace {

// The sizes of a checked call: batch = the leading dims (all but the last two), bh = their product.
struct AttentionDims {
  Shape batch;
  int64_t bh = 1, L = 0, S = 0, E = 0, Ev = 0;
  double scale = 1;
};

Shape leading(const Tensor& t) { return Shape(std::vector<int64_t>(t.shape().begin(), t.shape().end() - 2)); }

AttentionDims check_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                         std::optional<double> scale) {
  check_defined(q, op, "query");
  check_defined(k, op, "key");
  check_defined(v, op, "value");
  WEFT_CHECK(q.dim() >= 2, op, ": expected query [..., L, E] with at least 2 dims, got shape ", q.shape());
  WEFT_CHECK(k.dim() >= 2, op, ": expected key [..., S, E] with at least 2 dims, got shape ", k.shape());
  WEFT_CHECK(v.dim() >= 2, op, ": expected value [..., S, Ev] with at least 2 dims, got shape ", v.shape());
  check_floating(q, op);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, {&q, &k, &v});
  AttentionDims d;
  d.batch = leading(q);
  WEFT_CHECK(leading(k) == d.batch && leading(v) == d.batch, op,
             ": query, key and value must have equal leading (batch, head) dims (weft does not broadcast them), "
             "got query ",
             q.shape(), ", key ", k.shape(), ", value ", v.shape());
  d.L = q.size(-2);
  d.S = k.size(-2);
  d.E = q.size(-1);
  d.Ev = v.size(-1);
  WEFT_CHECK(k.size(-1) == d.E, op, ": query's last dim E = ", d.E, " must equal key's, got query ", q.shape(),
             " and key ", k.shape());
  WEFT_CHECK(v.size(-2) == d.S, op, ": key and value must have the same length S (dim -2), got key ", k.shape(),
             " and value ", v.shape());
  WEFT_CHECK(d.E >= 1, op, ": query and key have head dim E = 0 (shapes ", q.shape(), " and ", k.shape(),
             "); attention needs E >= 1");
  WEFT_CHECK(dropout_p >= 0 && dropout_p < 1, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  d.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d.E));
  WEFT_CHECK(std::isfinite(d.scale), op, ": scale must be finite, got ", d.scale);
  for (int64_t n : d.batch) d.bh *= n;
  return d;
}

// true where key j is masked for query i (j > i), [L, S] on `device`.
Tensor causal_mask(int64_t L, int64_t S, Device device) {
  const TensorOptions index(DType::Int64, device);
  return gt(arange(S, index).view({1, S}), arange(L, index).view({L, 1}));
}

Tensor math_impl(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double dropout_p,
                 const AttentionDims& d, Generator* gen) {
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), d.scale);
  if (is_causal) {
    const Tensor minus_inf =
        scalar_tensor(-std::numeric_limits<double>::infinity(), TensorOptions(q.dtype(), q.device()));
    scores = where(causal_mask(d.L, d.S, q.device()), minus_inf, scores);
  }
  Tensor attn = softmax(scores, -1);
  if (dropout_p > 0) attn = dropout(attn, dropout_p, /*training=*/true, gen);
  return matmul(attn, v);
}

// The fused backward on the flattened [BH, ...] tensors; gradients come back in the callers' shapes.
GradList fused_backward(const Tensor& grad, const Tensor& q3, const Tensor& k3, const Tensor& v3, const Tensor& out,
                        const Tensor& lse, const Shape& q_shape, const Shape& k_shape, const Shape& v_shape,
                        double scale, bool is_causal) {
  const int64_t bh = q3.size(0), L = q3.size(1), Ev = v3.size(2);
  const TensorOptions options(q3.dtype(), q3.device());
  Tensor g = grad.contiguous().view({bh, L, Ev});
  Tensor dq = empty(q3.shape(), options), dk = empty(k3.shape(), options), dv = empty(v3.shape(), options);
  Tensor delta = empty({bh, L}, TensorOptions(lse.dtype(), lse.device()));
  attention_backward_stub(q3.device(), g, q3, k3, v3, out.view({bh, L, Ev}), lse, delta, dq, dk, dv, scale,
                          is_causal);
  return {dq.view(q_shape), dk.view(k_shape), dv.view(v_shape)};
}

}  // namespace

Tensor scaled_dot_product_attention_math(const Tensor& query, const Tensor& key, const Tensor& value, bool is_causal,
                                         double dropout_p, std::optional<double> scale, Generator* gen) {
  const AttentionDims d = check_args("scaled_dot_product_attention_math", query, key, value, dropout_p, scale);
  return math_impl(query, key, value, is_causal, dropout_p, d, gen);
}

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value, bool is_causal,
                                    double dropout_p, std::optional<double> scale, Generator* gen) {
  const AttentionDims d = check_args("scaled_dot_product_attention", query, key, value, dropout_p, scale);
  if (dropout_p > 0) return math_impl(query, key, value, is_causal, dropout_p, d, gen);

  Shape out_shape = d.batch;
  out_shape.push_back(d.L);
  out_shape.push_back(d.Ev);
  const TensorOptions options(query.dtype(), query.device());
  // No key (S = 0) gives zeros, as the empty sum of the reference's second product does.
  if (d.bh == 0 || d.L == 0 || d.S == 0 || d.Ev == 0) {
    Tensor out = zeros(out_shape, options);
    if (any_requires_grad(query, key, value)) {
      set_history(out, make_node(
                           "ScaledDotProductAttentionBackward",
                           [qs = query.shape(), ks = key.shape(), vs = value.shape(), options](const GradList&) {
                             return GradList{zeros(qs, options), zeros(ks, options), zeros(vs, options)};
                           },
                           query, key, value));
    }
    return out;
  }

  Tensor q3, k3, v3;
  {
    NoGradGuard no_grad;
    q3 = query.reshape({d.bh, d.L, d.E}).contiguous();
    k3 = key.reshape({d.bh, d.S, d.E}).contiguous();
    v3 = value.reshape({d.bh, d.S, d.Ev}).contiguous();
  }
  Tensor out = empty(out_shape, options);
  Tensor lse = empty({d.bh, d.L}, options);
  attention_forward_stub(query.device(), q3, k3, v3, out.view({d.bh, d.L, d.Ev}), lse, d.scale, is_causal);
  if (any_requires_grad(query, key, value)) {
    set_history(out, make_node(
                         "ScaledDotProductAttentionBackward",
                         [sq = SavedTensor(q3), sk = SavedTensor(k3), sv = SavedTensor(v3),
                          so = SavedTensor(out, true), sl = SavedTensor(lse), qs = query.shape(), ks = key.shape(),
                          vs = value.shape(), scale = d.scale, is_causal](const GradList& g) -> GradList {
                           return fused_backward(g[0], sq.unpack(), sk.unpack(), sv.unpack(), so.unpack(),
                                                 sl.unpack(), qs, ks, vs, scale, is_causal);
                         },
                         query, key, value));
  }
  return out;
}

}  // namespace weft
