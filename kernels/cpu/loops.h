// Strided iteration over N operands that share one (broadcast) shape.
//
// This is the CPU half of every elementwise op: operands come with byte strides already
// broadcast to the output's shape (stride 0 on broadcast dims). Dims that are contiguous
// in *every* operand are merged first, so a contiguous tensor of any rank is one long
// run; the body then sees runs along the last dim (pointer per operand, byte stride per
// operand, length) and can keep a tight loop that the compiler vectorises when all
// strides equal the element size.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/parallel.h"

namespace weft::cpu {

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

// body(std::array<char*, N> ptrs, std::array<int64_t, N> byte_strides, int64_t n) for
// every run of the last dim; runs are split across threads for large operands.
template <int N, class Body>
void for_each_run(Operands<N> ops, const Body& body) {
  coalesce(ops);
  const int64_t ndim = ops.shape.size();
  const int64_t inner = ops.shape[ndim - 1];
  std::array<int64_t, N> inner_strides;
  for (int i = 0; i < N; ++i) inner_strides[i] = ops.strides[i][ndim - 1];
  parallel_for(0, ops.shape.numel(), kGrain, [&](int64_t begin, int64_t end) {
    int64_t pos = begin;
    while (pos < end) {
      // Multi-index of `pos`, then the operand pointers there.
      std::array<char*, N> ptrs = ops.data;
      int64_t rest = pos / inner, col = pos % inner;
      for (int64_t d = ndim - 2; d >= 0; --d) {
        int64_t idx = rest % ops.shape[d];
        rest /= ops.shape[d];
        for (int i = 0; i < N; ++i) ptrs[i] += idx * ops.strides[i][d];
      }
      for (int i = 0; i < N; ++i) ptrs[i] += col * inner_strides[i];
      int64_t n = std::min(inner - col, end - pos);
      body(ptrs, inner_strides, n);
      pos += n;
    }
  });
}

}  // namespace weft::cpu
