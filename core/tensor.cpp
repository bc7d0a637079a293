// Tensor metadata, copies, conversions and autograd accessors.
#include "core/tensor.h"

#include <sstream>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/device_backend.h"
#include "core/gradient_ops.h"

namespace weft {

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

int64_t Tensor::size(int64_t d) const { return impl_->sizes[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no elements, no layout (as PyTorch); contiguous_strides gives [1, 1] for [2, 0]
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    int64_t n = impl_->sizes[i];
    if (n == 1) continue;  // a size-1 dim's stride never matters
    if (impl_->strides[i] != expected) return false;
    expected *= n;
  }
  return true;
}

void Tensor::fail_data_ptr(DType asked) const {
  WEFT_FAIL("data_ptr: tensor has dtype ", dtype(), " but ", asked, " was asked for");
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), TensorOptions(dtype(), device()));
  copy_values(out, *this);
  if (any_requires_grad(*this))
    set_history(out, make_node("CloneBackward", [](const GradList& g) -> GradList { return {g[0]}; }, *this));
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), TensorOptions(dtype(), target));
  copy_values(out, *this);
  if (any_requires_grad(*this))
    set_history(out, make_node(
                         "ToDeviceBackward",
                         [source = device()](const GradList& g) -> GradList { return {g[0].to(source)}; }, *this));
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), TensorOptions(target, device()));
  copy_values(out, *this);
  if (is_floating(target) && any_requires_grad(*this))
    set_history(out, make_node(
                         "ToDTypeBackward",
                         [source = dtype()](const GradList& g) -> GradList { return {g[0].to(source)}; }, *this));
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  if (!any_requires_grad(*this, src)) {
    copy_values(*this, src);
    return *this;
  }
  check_inplace(*this, "copy_");
  WEFT_CHECK(broadcasts_to(src.shape(), shape()), "copy_: source shape ", src.shape(),
             " does not broadcast to destination shape ", shape());
  Tensor result = src.to(device()).to(dtype()).expand(shape()).clone();
  return commit_inplace(*this, result, "copy_");
}

Tensor Tensor::pin_memory() const {
  WEFT_CHECK(device().is_cpu(), "pin_memory: only host tensors can be pinned; this one lives on ", device());
  if (is_pinned()) return *this;
  Allocator* pinned = pinned_allocator();
  WEFT_CHECK(pinned != nullptr, "pin_memory: page-locked memory needs a usable CUDA GPU (",
             cuda_unavailable_reason(), ")");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(static_cast<size_t>(nbytes()), *pinned);
  impl->sizes = shape();
  impl->strides = contiguous_strides(shape());
  impl->dtype = dtype();
  Tensor out(std::move(impl));
  copy_values(out, *this);
  if (any_requires_grad(*this))
    set_history(out, make_node("PinMemoryBackward", [](const GradList& g) -> GradList { return {g[0]}; }, *this));
  return out;
}

bool Tensor::is_pinned() const {
  if (!device().is_cpu() || !impl_->storage) return false;
  const Allocator* pinned = pinned_allocator();
  return pinned != nullptr && &impl_->storage->allocator() == pinned;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->sizes = impl_->sizes;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

double Tensor::item() const {
  WEFT_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape());
  if (!device().is_cpu()) return to(kCPU).item();
  if (is_half_precision(dtype())) return to(DType::Float64).item();
  return dispatch_dtype(dtype(), DTypeSet::All, "item", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return static_cast<double>(*static_cast<const T*>(raw_data()));
  });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(kCPU).to(dtype_of<T>).contiguous();
  const T* p = host.data_ptr<T>();
  return std::vector<T>(p, p + host.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

// --- autograd accessors -------------------------------------------------------------

AutogradMeta& Tensor::autograd_meta() const {
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  return *impl_->autograd;
}

bool Tensor::requires_grad() const {
  const AutogradMeta* m = impl_->autograd.get();
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  WEFT_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad (this one was made by ",
             grad_fn()->name(), "); use detach() to get a leaf");
  WEFT_CHECK(!requires_grad || is_floating(dtype()), "requires_grad_: only floating-point tensors can require "
             "gradients, got dtype ", dtype());
  AutogradMeta& m = autograd_meta();
  m.requires_grad = requires_grad;
  if (requires_grad && !m.grad_accumulator) m.grad_accumulator = std::make_shared<AccumulateGrad>(impl_);
  return *this;
}

bool Tensor::is_leaf() const { return !impl_->autograd || impl_->autograd->grad_fn == nullptr; }

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  return impl_->autograd ? impl_->autograd->grad : undefined;
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    WEFT_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
               "set_grad: gradient ", grad.shape(), " ", grad.dtype(), " on ", grad.device(),
               " does not match tensor ", shape(), " ", dtype(), " on ", device());
  }
  autograd_meta().grad = grad;
}

void Tensor::set_data(const Tensor& src) const {
  WEFT_CHECK(src.defined(), "set_data: the source is an undefined tensor");
  WEFT_CHECK(is_leaf(), "set_data: only a leaf tensor can take new data (this one was made by ", grad_fn()->name(), ")");
  WEFT_CHECK(!requires_grad() || is_floating(src.dtype()), "set_data: a tensor that requires grad needs floating "
             "data, got ", src.dtype());
  impl_->storage = src.storage();
  impl_->sizes = src.shape();
  impl_->strides = src.strides();
  impl_->offset = src.offset();
  impl_->dtype = src.dtype();
  impl_->is_view = false;
  if (AutogradMeta* m = impl_->autograd.get()) {
    m->grad = Tensor();
    // The accumulator checks gradients against the leaf's shape, dtype and device.
    if (m->grad_accumulator) m->grad_accumulator->reset_leaf_meta(Tensor(impl_));
  }
}

std::shared_ptr<Node> Tensor::grad_fn() const { return impl_->autograd ? impl_->autograd->grad_fn : nullptr; }
uint32_t Tensor::output_nr() const { return impl_->autograd ? impl_->autograd->output_nr : 0; }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  WEFT_CHECK(requires_grad(), "backward: tensor does not require grad and has no grad_fn");
  Tensor g = gradient;
  if (!g.defined()) {
    WEFT_CHECK(numel() == 1, "backward: grad can be implicitly created only for one-element outputs, "
               "got shape ", shape(), "; pass a gradient");
    g = ones(shape(), TensorOptions(dtype(), device()));
  }
  Tensor root = *this;
  run_backward(std::span<const Tensor>(&root, 1), std::span<const Tensor>(&g, 1), retain_graph);
}

void Tensor::retain_grad() const {
  WEFT_CHECK(requires_grad(), "retain_grad: tensor does not require grad");
  if (is_leaf() || retains_grad()) return;  // leaves keep .grad anyway
  AutogradMeta& m = autograd_meta();
  m.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  m.grad_fn->add_pre_hook(m.output_nr, [weak](const Tensor& g) -> Tensor {
    if (auto impl = weak.lock()) {
      Tensor& grad = impl->autograd->grad;
      grad = grad.defined() ? gradient_ops().add(grad, g) : g.clone();
    }
    return Tensor();
  });
}

bool Tensor::retains_grad() const { return impl_->autograd && impl_->autograd->retains_grad; }

HookHandle Tensor::register_hook(TensorHook hook) const {
  WEFT_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that does not require grad");
  AutogradMeta& m = autograd_meta();
  Node* node = m.grad_fn ? m.grad_fn.get() : static_cast<Node*>(m.grad_accumulator.get());
  return node->add_pre_hook(m.output_nr, std::move(hook));
}

HookHandle Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  WEFT_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: only leaf tensors that require "
             "grad accumulate gradients");
  return autograd_meta().grad_accumulator->add_post_hook(std::move(hook));
}

void Tensor::remove_hook(HookHandle handle) const {
  if (!impl_->autograd) return;
  AutogradMeta& m = *impl_->autograd;
  if (m.grad_fn && m.grad_fn->remove_pre_hook(handle)) return;
  if (m.grad_accumulator && (m.grad_accumulator->remove_pre_hook(handle) || m.grad_accumulator->remove_post_hook(handle)))
    return;
}

std::string Tensor::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

}  // namespace weft
