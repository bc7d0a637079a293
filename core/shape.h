// Shape: sizes (or strides) of a tensor, stored inline.
//
// A tensor's metadata is created on every op, so it must not touch the heap: Shape keeps
// up to kMaxDims extents in place. Eight dimensions cover every layer in weft (conv is
// 4-d, batched matmul with broadcast batch dims rarely passes 5); asking for more is a
// clear error rather than a silent heap fallback.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace weft {

constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.size()); }
  Shape(std::span<const int64_t> dims) { assign(dims.data(), dims.size()); }
  Shape(const std::vector<int64_t>& dims) { assign(dims.data(), dims.size()); }

  int64_t size() const { return ndim_; }
  bool empty() const { return ndim_ == 0; }
  int64_t& operator[](int64_t i) { return dims_[i]; }
  int64_t operator[](int64_t i) const { return dims_[i]; }
  int64_t back() const { return dims_[ndim_ - 1]; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  int64_t* begin() { return dims_.data(); }
  int64_t* end() { return dims_.data() + ndim_; }
  const int64_t* data() const { return dims_.data(); }

  void push_back(int64_t v) {
    WEFT_CHECK(ndim_ < kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
    dims_[ndim_++] = v;
  }
  void insert(int64_t pos, int64_t v);
  void erase(int64_t pos);
  void resize(int64_t n, int64_t fill = 0);

  // Product of extents (1 for a 0-d shape).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= dims_[i];
    return n;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.ndim_ != b.ndim_) return false;
    for (int i = 0; i < a.ndim_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

 private:
  void assign(const int64_t* p, size_t n) {
    WEFT_CHECK(n <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions, got ", n);
    ndim_ = static_cast<int8_t>(n);
    for (size_t i = 0; i < n; ++i) dims_[i] = p[i];
  }

  std::array<int64_t, kMaxDims> dims_{};
  int8_t ndim_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

// Row-major strides, in elements.
Shape contiguous_strides(const Shape& sizes);
// shape.numel(), checked: an error naming `op` and the shape when the count, or the product
// of the non-zero extents (what strides are made of), does not fit in an int64.
int64_t checked_numel(const Shape& shape, const char* op);

// Wraps a possibly negative dim into [0, ndim); names `op` in the error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// NumPy broadcasting of two shapes; the error names op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// A shape read as [outer, size, inner] around one dim: what every "along dim" kernel
// (softmax, index_select, ...) iterates over. A 0-d shape is one element.
struct DimSplit {
  int64_t outer = 1, size = 1, inner = 1;
};
DimSplit split_at_dim(const Shape& shape, int64_t dim);

// Whether `from` broadcasts to exactly `to` (what copy_ and in-place ops need).
bool broadcasts_to(const Shape& from, const Shape& to);

// Strides that read a tensor of (sizes, strides) as if it had shape `target`
// (broadcast dims get stride 0). `sizes` must broadcast to `target`.
Shape broadcast_strides(const Shape& sizes, const Shape& strides, const Shape& target);

}  // namespace weft
