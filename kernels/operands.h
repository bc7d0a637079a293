// Operands: N tensors read as one (broadcast) shape, with byte strides.
//
// Shared by the CPU loops (kernels/cpu/loops.h) and the CUDA ones (kernels/cuda/loops.cuh):
// both first merge the dims that are contiguous in every operand, so that a contiguous
// tensor of any rank is walked as one flat run and a transposed one pays only for the
// dims that really are strided.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace weft {

template <int N>
struct Operands {
  std::array<char*, N> data{};
  std::array<Shape, N> strides{};  // bytes, broadcast to `shape`
  Shape shape;
};

// Operand i is tensors[i] read as `shape` (tensors must broadcast to it).
template <int N>
Operands<N> make_operands(const Shape& shape, const std::array<const Tensor*, N>& tensors) {
  Operands<N> ops;
  ops.shape = shape;
  for (int i = 0; i < N; ++i) {
    const Tensor& t = *tensors[i];
    ops.data[i] = static_cast<char*>(t.raw_data());
    ops.strides[i] = broadcast_strides(t.shape(), t.strides(), shape);
    for (int64_t& s : ops.strides[i]) s *= t.element_size();
  }
  return ops;
}

// Drops size-1 dims and merges neighbours that are contiguous in every operand.
template <int N>
void coalesce(Operands<N>& ops) {
  Shape shape;
  std::array<Shape, N> strides;
  for (int64_t d = 0; d < ops.shape.size(); ++d) {
    if (ops.shape[d] == 1) continue;
    bool merge = !shape.empty();
    for (int i = 0; merge && i < N; ++i) merge = strides[i].back() == ops.strides[i][d] * ops.shape[d];
    if (merge) {
      shape[shape.size() - 1] *= ops.shape[d];
      for (int i = 0; i < N; ++i) strides[i][strides[i].size() - 1] = ops.strides[i][d];
    } else {
      shape.push_back(ops.shape[d]);
      for (int i = 0; i < N; ++i) strides[i].push_back(ops.strides[i][d]);
    }
  }
  if (shape.empty()) {  // a single element
    shape.push_back(1);
    for (int i = 0; i < N; ++i) strides[i].push_back(0);
  }
  ops.shape = shape;
  ops.strides = strides;
}

}  // namespace weft
