// Tensor: a handle to (storage, sizes, strides, offset, dtype) plus autograd state.
//
// Like PyTorch's TensorImpl, views alias one Storage and keep their own sizes, strides
// and offset (in elements). A Tensor is a shared handle: copying it aliases, and
// clone() copies. Math lives in free functions (kernels/*.h); this class holds metadata,
// views, conversions and the autograd entry points.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace weft {

class Node;
class Tensor;
struct AutogradMeta;

// A tensor hook sees the gradient flowing into a tensor; returning a defined tensor
// replaces that gradient.
using TensorHook = std::function<Tensor(const Tensor&)>;
// Runs after a leaf's .grad has been accumulated (DDP launches its all-reduce here).
using PostAccumulateGradHook = std::function<void(const Tensor&)>;
using HookHandle = uint64_t;

struct TensorImpl {
  Storage storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  bool is_view = false;
  std::unique_ptr<AutogradMeta> autograd;  // null until autograd needs it

  TensorImpl();
  ~TensorImpl();
};

// What a factory creates: dtype, device and whether the result is a leaf requiring grad.
struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = kCPU;
  bool requires_grad = false;

  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}
  TensorOptions(Device d) : device(d) {}
  TensorOptions(DType d, Device dev, bool rg = false) : dtype(d), device(dev), requires_grad(rg) {}
  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r = true) const { auto o = *this; o.requires_grad = r; return o; }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // --- metadata -------------------------------------------------------------------
  const Shape& shape() const { return impl_->sizes; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return impl_->sizes.size(); }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t offset() const { return impl_->offset; }
  int64_t numel() const { return impl_->sizes.numel(); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  int64_t element_size() const { return weft::element_size(impl_->dtype); }
  int64_t nbytes() const { return numel() * element_size(); }
  bool is_contiguous() const;
  bool is_view() const { return impl_->is_view; }
  const Storage& storage() const { return impl_->storage; }
  // Storage version: bumped by every in-place write to any view of the same bytes.
  uint32_t version() const { return impl_->storage->version(); }
  void bump_version() const { impl_->storage->bump_version(); }

  // Address of element [0, ..., 0]; typed access checks the dtype.
  void* raw_data() const {
    return static_cast<char*>(impl_->storage->data()) + impl_->offset * element_size();
  }
  template <class T>
  T* data_ptr() const {
    if (dtype_of<T> != impl_->dtype) [[unlikely]] fail_data_ptr(dtype_of<T>);
    return static_cast<T*>(raw_data());
  }

  // --- views (alias storage; differentiable) --------------------------------------
  Tensor view(const Shape& shape) const;  // one dim may be -1; fails if strides forbid
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a 2-d tensor
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a size
  Tensor broadcast_to(const Shape& shape) const { return expand(shape); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  // Raw strided view; not differentiable (fails if autograd would need it).
  Tensor as_strided(const Shape& sizes, const Shape& strides, int64_t offset) const;

  // --- copies and conversions ------------------------------------------------------
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;  // self if already there
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const { return to(device).to(dtype); }
  const Tensor& copy_(const Tensor& src) const;  // broadcasts src, converts dtype, crosses devices
  Tensor detach() const;             // shares storage, no autograd history
  // A copy in page-locked host memory, from which copies to a GPU are asynchronous
  // (PyTorch's pin_memory); the tensor itself if it is pinned already. Needs a GPU.
  Tensor pin_memory() const;
  bool is_pinned() const;

  double item() const;  // for a one-element tensor
  template <class T>
  T item() const { return static_cast<T>(item()); }
  // Flat copy of the values, in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;

  // --- autograd ---------------------------------------------------------------------
  bool requires_grad() const;
  const Tensor& requires_grad_(bool requires_grad = true) const;
  bool is_leaf() const;
  const Tensor& grad() const;   // undefined if none was accumulated
  void set_grad(const Tensor& grad);
  // Makes this leaf hold src's values, shape, dtype and device while keeping its
  // identity (what PyTorch's `param.data = src` does): handles held elsewhere, an
  // optimizer's for instance, see the new data. Drops .grad.
  void set_data(const Tensor& src) const;
  std::shared_ptr<Node> grad_fn() const;
  uint32_t output_nr() const;
  // gradient defaults to 1 for a one-element tensor.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  void retain_grad() const;
  bool retains_grad() const;
  HookHandle register_hook(TensorHook hook) const;
  HookHandle register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  void remove_hook(HookHandle handle) const;

  AutogradMeta& autograd_meta() const;  // creates it on first use

  std::string str() const;

 private:
  [[noreturn]] void fail_data_ptr(DType asked) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// --- factories (core/factories.cpp) --------------------------------------------------
Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) with step; dtype int64 unless options say otherwise.
Tensor arange(double start, double end, double step = 1, const TensorOptions& options = DType::Int64);
Tensor arange(int64_t end, const TensorOptions& options = DType::Int64);
// A 0-d tensor.
Tensor scalar_tensor(double value, const TensorOptions& options = {});

// From host values, with a shape (default: 1-d of the values' length).
template <class T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, const TensorOptions& options);
template <class T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  return tensor(values, shape, TensorOptions(dtype_of<T>));
}
template <class T>
Tensor tensor(const std::vector<T>& values) {
  return tensor(values, Shape{static_cast<int64_t>(values.size())});
}
inline Tensor tensor(std::initializer_list<float> values, const Shape& shape) {
  return tensor(std::vector<float>(values), shape);
}
inline Tensor tensor(std::initializer_list<float> values) { return tensor(std::vector<float>(values)); }

}  // namespace weft
