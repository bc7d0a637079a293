// Shared argument checks.
#include "kernels/checks.h"

#include <cmath>

namespace weft {

void check_defined(const Tensor& t, const char* op, const char* arg) {
  WEFT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor& first = **tensors.begin();
  for (const Tensor* t : tensors)
    WEFT_CHECK(t->device() == first.device(), op, ": expected all tensors on one device, got ", first.device(),
               " and ", t->device(), " (move one with .to(device))");
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  WEFT_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", a.dtype(), " and ", b.dtype(),
             " (weft does not promote; convert one with .to(DType))");
}

void check_floating(const Tensor& t, const char* op) {
  check_supported(t.dtype(), op);
  WEFT_CHECK(is_floating(t.dtype()), op, ": expected a float32 or float64 tensor, got ", t.dtype());
}

void check_dim(const Tensor& t, int64_t ndim, const char* op, const char* arg) {
  WEFT_CHECK(t.dim() == ndim, op, ": expected '", arg, "' to have ", ndim, " dimensions, got shape ", t.shape());
}

void check_scalar_fits(const Tensor& t, double scalar, const char* op) {
  WEFT_CHECK(is_floating(t.dtype()) || scalar == std::trunc(scalar), op, ": scalar ", scalar,
             " is not integral but the tensor is ", t.dtype(), " (convert it with .to(DType::Float32))");
}

}  // namespace weft
