// Shape helpers: printing, strides, dim wrapping, broadcasting.
#include "core/shape.h"

#include <ostream>
#include <sstream>

namespace weft {

void Shape::insert(int64_t pos, int64_t v) {
  WEFT_CHECK(ndim_ < kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
  for (int64_t i = ndim_; i > pos; --i) dims_[i] = dims_[i - 1];
  dims_[pos] = v;
  ++ndim_;
}

void Shape::erase(int64_t pos) {
  for (int64_t i = pos; i + 1 < ndim_; ++i) dims_[i] = dims_[i + 1];
  --ndim_;
}

void Shape::resize(int64_t n, int64_t fill) {
  WEFT_CHECK(n >= 0 && n <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions, got ", n);
  for (int64_t i = ndim_; i < n; ++i) dims_[i] = fill;
  ndim_ = static_cast<int8_t>(n);
}

std::string Shape::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  out << '[';
  for (int64_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  return out << ']';
}

int64_t checked_numel(const Shape& shape, const char* op) {
  int64_t count = 1, nonzero = 1;
  for (int64_t n : shape) {
    if (n == 0) {
      count = 0;
      continue;
    }
    WEFT_CHECK(!__builtin_mul_overflow(nonzero, n, &nonzero), op, ": shape ", shape,
               " has more elements than an int64 counts");
    count = count == 0 ? 0 : nonzero;
  }
  return count;
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides;
  strides.resize(sizes.size());
  int64_t s = 1;
  for (int64_t i = sizes.size() - 1; i >= 0; --i) {
    strides[i] = s;
    s *= sizes[i] > 0 ? sizes[i] : 1;
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = ndim == 0 ? 1 : ndim;  // a 0-d tensor accepts dim 0 and -1, as in PyTorch
  WEFT_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor with ", ndim,
             " dimension(s) (expected ", -n, " .. ", n - 1, ")");
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  if (a == b) return a;
  int64_t n = std::max(a.size(), b.size());
  Shape out;
  out.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t da = i - (n - a.size()) >= 0 ? a[i - (n - a.size())] : 1;
    int64_t db = i - (n - b.size()) >= 0 ? b[i - (n - b.size())] : 1;
    WEFT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
               " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

DimSplit split_at_dim(const Shape& shape, int64_t dim) {
  DimSplit s;
  if (shape.empty()) return s;
  for (int64_t d = 0; d < dim; ++d) s.outer *= shape[d];
  s.size = shape[dim];
  for (int64_t d = dim + 1; d < shape.size(); ++d) s.inner *= shape[d];
  return s;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  int64_t lead = to.size() - from.size();
  for (int64_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[i + lead]) return false;
  return true;
}

Shape broadcast_strides(const Shape& sizes, const Shape& strides, const Shape& target) {
  Shape out;
  out.resize(target.size());
  int64_t lead = target.size() - sizes.size();
  for (int64_t i = 0; i < target.size(); ++i) {
    int64_t j = i - lead;
    out[i] = (j < 0 || sizes[j] == 1) ? 0 : strides[j];
  }
  return out;
}

}  // namespace weft
