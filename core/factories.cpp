// Tensor factories: empty, zeros, ones, full, arange, and tensors from host values.
#include <cmath>
#include <cstring>

#include "core/autograd.h"
#include "core/copy.h"

namespace weft {

Tensor empty(const Shape& shape, const TensorOptions& options) {
  for (int64_t n : shape) WEFT_CHECK(n >= 0, "empty: negative size in shape ", shape);
  int64_t bytes = 0;
  WEFT_CHECK(!__builtin_mul_overflow(checked_numel(shape, "empty"), element_size(options.dtype), &bytes), "empty: shape ",
             shape, " of ", options.dtype, " has more bytes than an int64 counts");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = make_storage(static_cast<size_t>(bytes), options.device);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  Tensor t(std::move(impl));
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  Tensor t = empty(shape, options.with_requires_grad(false));
  if (t.numel() > 0) fill_stub(t.device(), t, value);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }

Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, TensorOptions(t.dtype(), t.device())); }

Tensor scalar_tensor(double value, const TensorOptions& options) { return full(Shape{}, value, options); }

Tensor arange(double start, double end, double step, const TensorOptions& options) {
  WEFT_CHECK(step != 0, "arange: step must be non-zero");
  WEFT_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange: start, end and step must be "
             "finite");
  double count = std::ceil((end - start) / step);
  int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  Tensor host = empty({n}, TensorOptions(DType::Float64));
  double* p = host.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  Tensor out = host.to(options.dtype).to(options.device);
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor arange(int64_t end, const TensorOptions& options) { return arange(0.0, static_cast<double>(end), 1.0, options); }

template <class T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  WEFT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "tensor: ", values.size(),
             " values do not fill shape ", shape, " (", shape.numel(), " elements)");
  Tensor host = empty(shape, TensorOptions(dtype_of<T>));
  T* p = host.data_ptr<T>();
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else if (!values.empty()) {
    std::memcpy(p, values.data(), values.size() * sizeof(T));
  }
  Tensor out = host.to(options.dtype).to(options.device);
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

template Tensor tensor(const std::vector<float>&, const Shape&, const TensorOptions&);
template Tensor tensor(const std::vector<double>&, const Shape&, const TensorOptions&);
template Tensor tensor(const std::vector<int64_t>&, const Shape&, const TensorOptions&);
template Tensor tensor(const std::vector<int32_t>&, const Shape&, const TensorOptions&);
template Tensor tensor(const std::vector<uint8_t>&, const Shape&, const TensorOptions&);
template Tensor tensor(const std::vector<bool>&, const Shape&, const TensorOptions&);

}  // namespace weft
