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
#include "kernels/operands.h"

namespace weft::cpu {

using weft::coalesce;
using weft::make_operands;
using weft::Operands;

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
