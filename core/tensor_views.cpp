// View ops: new sizes / strides / offset over the same storage, each differentiable.
//
// A view's backward maps the gradient of the view back onto the base's shape: a reshape
// or permutation for the shape-only views, a scatter into zeros for narrow / slice /
// select, and a sum over the broadcast dims for expand.
#include <algorithm>
#include <optional>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/gradient_ops.h"

namespace weft {

namespace {

Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->is_view = true;
  return Tensor(std::move(impl));
}

// Records a view whose gradient is `g` scattered into zeros of the base's shape through
// the same view (narrow, slice, select).
template <class ViewFn>
Tensor record_scatter_view(const Tensor& base, Tensor view, const char* name, ViewFn view_fn) {
  if (any_requires_grad(base)) {
    set_history(view, make_node(
                          name,
                          [shape = base.shape(), view_fn](const GradList& g) -> GradList {
                            Tensor grad_in = zeros(shape, TensorOptions(g[0].dtype(), g[0].device()));
                            copy_values(view_fn(grad_in), g[0]);
                            return {grad_in};
                          },
                          base));
  }
  return view;
}

Tensor record_reshape_view(const Tensor& base, Tensor view, const char* name) {
  if (any_requires_grad(base)) {
    set_history(view, make_node(
                          name, [shape = base.shape()](const GradList& g) -> GradList { return {g[0].reshape(shape)}; },
                          base));
  }
  return view;
}

// Replaces one -1 by the size that keeps numel; checks the element count.
Shape infer_size(const Shape& requested, int64_t numel, const char* op) {
  Shape out = requested;
  int64_t known = 1, infer_at = -1;
  for (int64_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      WEFT_CHECK(infer_at < 0, op, ": only one dimension can be -1, got shape ", requested);
      infer_at = i;
    } else {
      WEFT_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in shape ", requested);
      WEFT_CHECK(!__builtin_mul_overflow(known, out[i], &known), op, ": shape ", requested,
                 " has more elements than an int64 counts");
    }
  }
  if (infer_at >= 0) {
    WEFT_CHECK(known != 0 && numel % known == 0, op, ": shape ", requested, " is invalid for input of size ", numel);
    out[infer_at] = numel / known;
  }
  WEFT_CHECK(checked_numel(out, op) == numel, op, ": shape ", requested, " is invalid for input of size ", numel);
  return out;
}

// Strides that let (old_sizes, old_strides) be read as new_sizes without a copy, if any
// exist: contiguous runs of the old layout may be split or merged, nothing else.
std::optional<Shape> view_strides(const Shape& old_sizes, const Shape& old_strides, const Shape& new_sizes) {
  Shape new_strides;
  new_strides.resize(new_sizes.size());
  if (old_sizes.numel() == 0 || old_sizes.empty()) return contiguous_strides(new_sizes);
  int64_t view_d = new_sizes.size() - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = old_sizes.size() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_sizes[tensor_d];
    bool chunk_ends = tensor_d == 0 || (old_sizes[tensor_d - 1] != 1 &&
                                        old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_sizes[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = old_strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape sizes = infer_size(requested, numel(), "view");
  std::optional<Shape> strides = is_contiguous() ? contiguous_strides(sizes) : view_strides(shape(), this->strides(), sizes);
  WEFT_CHECK(strides.has_value(), "view: shape ", requested, " is not compatible with the input's shape ", shape(),
             " and strides ", this->strides(), " (use reshape, which copies when it must)");
  return record_reshape_view(*this, make_view(*this, sizes, *strides, offset()), "ViewBackward");
}

Tensor Tensor::reshape(const Shape& requested) const {
  Shape sizes = infer_size(requested, numel(), "reshape");
  std::optional<Shape> strides = is_contiguous() ? contiguous_strides(sizes) : view_strides(shape(), this->strides(), sizes);
  if (strides) return record_reshape_view(*this, make_view(*this, sizes, *strides, offset()), "ReshapeBackward");
  return clone().view(sizes);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  WEFT_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: expected ", dim(), " dims for a tensor of shape ",
             shape(), ", got ", dims.size());
  Shape sizes, strides;
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    WEFT_CHECK(inverse[d] < 0, "permute: dim ", d, " appears twice");
    inverse[d] = static_cast<int64_t>(i);
    sizes.push_back(shape()[d]);
    strides.push_back(this->strides()[d]);
  }
  Tensor out = make_view(*this, sizes, strides, offset());
  if (any_requires_grad(*this))
    set_history(out, make_node(
                         "PermuteBackward", [inverse](const GradList& g) -> GradList { return {g[0].permute(inverse)}; },
                         *this));
  return out;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  std::vector<int64_t> dims(dim());
  for (int64_t i = 0; i < dim(); ++i) dims[i] = i;
  if (dim() == 0) return permute(dims);
  std::swap(dims[wrap_dim(dim0, dim(), "transpose")], dims[wrap_dim(dim1, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::t() const {
  WEFT_CHECK(dim() <= 2, "t: expected a tensor with at most 2 dimensions, got shape ", shape());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  WEFT_CHECK(dim() > 0, "narrow: cannot narrow a 0-d tensor");
  d = wrap_dim(d, dim(), "narrow");
  int64_t n = shape()[d];
  if (start < 0) start += n;
  WEFT_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: range [", start, ", ", start + length,
             ") is out of bounds for dim ", d, " of size ", n, " (shape ", shape(), ")");
  return slice(d, start, start + length, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  WEFT_CHECK(dim() > 0, "slice: cannot slice a 0-d tensor");
  d = wrap_dim(d, dim(), "slice");
  WEFT_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = shape()[d];
  // Python semantics: negative indices count from the end, out-of-range ones clamp.
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sizes = shape(), strides = this->strides();
  sizes[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor out = make_view(*this, sizes, strides, offset() + start * this->strides()[d]);
  return record_scatter_view(*this, out, "SliceBackward",
                             [=](const Tensor& t) { return t.slice(d, start, end, step); });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  WEFT_CHECK(dim() > 0, "select: cannot select from a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  WEFT_CHECK(index >= -n && index < n, "select: index ", index, " is out of bounds for dim ", d, " of size ", n);
  if (index < 0) index += n;
  Shape sizes = shape(), strides = this->strides();
  sizes.erase(d);
  strides.erase(d);
  Tensor out = make_view(*this, sizes, strides, offset() + index * this->strides()[d]);
  return record_scatter_view(*this, out, "SelectBackward", [=](const Tensor& t) { return t.select(d, index); });
}

Tensor Tensor::expand(const Shape& requested) const {
  WEFT_CHECK(requested.size() >= dim(), "expand: target shape ", requested, " has fewer dims than the input's ",
             shape());
  int64_t lead = requested.size() - dim();
  Shape sizes, strides;
  sizes.resize(requested.size());
  strides.resize(requested.size());
  for (int64_t i = 0; i < requested.size(); ++i) {
    int64_t j = i - lead;
    int64_t want = requested[i];
    if (j < 0) {
      WEFT_CHECK(want >= 0, "expand: -1 is not allowed for a new leading dim (target ", requested, ")");
      sizes[i] = want;
      strides[i] = 0;
      continue;
    }
    int64_t have = shape()[j];
    if (want == -1) want = have;
    WEFT_CHECK(have == want || have == 1, "expand: cannot expand shape ", shape(), " to ", requested, " (dim ", i,
               ": ", have, " vs ", want, ")");
    sizes[i] = want;
    strides[i] = have == want ? this->strides()[j] : 0;
  }
  if (sizes == shape()) return *this;
  checked_numel(sizes, "expand");
  Tensor out = make_view(*this, sizes, strides, offset());
  if (any_requires_grad(*this))
    set_history(out, make_node(
                         "ExpandBackward",
                         [shape = shape()](const GradList& g) -> GradList { return {gradient_ops().sum_to_shape(g[0], shape)}; },
                         *this));
  return out;
}

Tensor Tensor::squeeze() const {
  Shape sizes, strides;
  for (int64_t i = 0; i < dim(); ++i) {
    if (shape()[i] == 1) continue;
    sizes.push_back(shape()[i]);
    strides.push_back(this->strides()[i]);
  }
  return record_reshape_view(*this, make_view(*this, sizes, strides, offset()), "SqueezeBackward");
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape sizes = shape(), strides = this->strides();
  sizes.erase(d);
  strides.erase(d);
  return record_reshape_view(*this, make_view(*this, sizes, strides, offset()), "SqueezeBackward");
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sizes = shape(), strides = this->strides();
  int64_t stride = d < dim() ? shape()[d] * this->strides()[d] : 1;
  sizes.insert(d, 1);
  strides.insert(d, stride);
  return record_reshape_view(*this, make_view(*this, sizes, strides, offset()), "UnsqueezeBackward");
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  WEFT_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape sizes;
  for (int64_t i = 0; i < start_dim; ++i) sizes.push_back(shape()[i]);
  int64_t merged = 1;
  for (int64_t i = start_dim; i <= end_dim; ++i) merged *= shape()[i];
  sizes.push_back(merged);
  for (int64_t i = end_dim + 1; i < dim(); ++i) sizes.push_back(shape()[i]);
  return reshape(sizes);
}

Tensor Tensor::as_strided(const Shape& sizes, const Shape& strides, int64_t offset) const {
  WEFT_CHECK(!any_requires_grad(*this), "as_strided: not differentiable; call it under NoGradGuard or on a "
             "detached tensor");
  WEFT_CHECK(sizes.size() == strides.size(), "as_strided: sizes ", sizes, " and strides ", strides,
             " differ in length");
  bool empty_view = sizes.numel() == 0;
  int64_t last = offset;
  for (int64_t i = 0; i < sizes.size(); ++i) {
    WEFT_CHECK(sizes[i] >= 0 && strides[i] >= 0, "as_strided: negative size or stride in ", sizes, " / ", strides);
    if (!empty_view) last += (sizes[i] - 1) * strides[i];
  }
  int64_t capacity = static_cast<int64_t>(storage()->nbytes()) / element_size();
  WEFT_CHECK(offset >= 0 && (empty_view || last < capacity), "as_strided: sizes ", sizes, " strides ", strides, " offset ", offset,
             " reach element ", last, " but the storage holds ", capacity);
  return make_view(*this, sizes, strides, offset);
}

}  // namespace weft
