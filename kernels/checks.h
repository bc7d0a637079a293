// Argument checks shared by the Tensor-level ops. Each names the op and what is wrong.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace weft {

void check_defined(const Tensor& t, const char* op, const char* arg);
// All tensors on the first one's device; the error names both devices.
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_floating(const Tensor& t, const char* op);
void check_dim(const Tensor& t, int64_t ndim, const char* op, const char* arg);
// A scalar that is not integral cannot meet an integer tensor (weft does not promote).
void check_scalar_fits(const Tensor& t, double scalar, const char* op);

}  // namespace weft
