// CPU kernels of the indexing family (see kernels/index_ops_kernels.h for the contracts).
//
// Note [Deterministic scatter]: the accumulating kernels never let two threads add into
// one element, and every element receives its contributions in index order. index_add
// splits the destination [outer, n, inner] into (outer row, column block, row range)
// tasks; each task walks the whole index in order and keeps only the entries that land
// in its rows. scatter_add splits by fibers (all coordinates but `dim`): a source fiber
// only ever writes into the destination fiber with the same coordinates. Neither split
// depends on the thread count for the order of the additions, only for who does them.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/index_ops_kernels.h"

namespace weft {

namespace {

IndexRange index_range_kernel(const Tensor& index, int64_t bound, const char*, bool) {
  // One pass over int64 values is memory-bound and cheap next to the op it guards.
  const int64_t* p = static_cast<const int64_t*>(index.raw_data());
  const int64_t n = index.numel();
  IndexRange r{p[0], p[0], -1, 0};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = p[i];
    r.min = std::min(r.min, v);
    r.max = std::max(r.max, v);
    if ((v < 0 || v >= bound) && r.first_bad < 0) {
      r.first_bad = i;
      r.bad_value = v;
    }
  }
  return r;
}

void index_select_kernel(const Tensor& x, const Tensor& index, const Tensor& out, int64_t outer, int64_t n,
                         int64_t inner) {
  const int64_t* idx = static_cast<const int64_t*>(index.raw_data());
  const int64_t k = index.numel();
  dispatch_dtype(x.dtype(), DTypeSet::All, "index_select", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = static_cast<const T*>(x.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    const int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(inner, 1));
    cpu::parallel_for(0, outer * k, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = src + ((r / k) * n + idx[r % k]) * inner;
        if (inner == 1) dst[r] = *row;
        else std::memcpy(dst + r * inner, row, static_cast<size_t>(inner) * sizeof(T));
      }
    });
  });
}

void index_add_kernel(const Tensor& src, const Tensor& index, const Tensor& out, int64_t outer, int64_t n,
                      int64_t inner, int64_t skip) {
  const int64_t* idx = static_cast<const int64_t*>(index.raw_data());
  const int64_t k = index.numel();
  // Tasks: outer rows x column blocks x destination row ranges (Note [Deterministic scatter]).
  constexpr int64_t kBlock = 512;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  int64_t row_parts = 1;
  if (k * inner > cpu::kGrain && outer * blocks < num_threads())
    row_parts = std::min<int64_t>(n, num_threads());
  const int64_t tasks = outer * blocks * row_parts;
  const int64_t work = std::max<int64_t>(1, k * std::min(inner, kBlock) / row_parts);
  dispatch_dtype(out.dtype(), DTypeSet::Numeric, "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src.raw_data());
    T* d = static_cast<T*>(out.raw_data());
    cpu::parallel_for(0, tasks, std::max<int64_t>(1, cpu::kGrain / work), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t part = t % row_parts, block = (t / row_parts) % blocks, o = t / (row_parts * blocks);
        const int64_t row_lo = n * part / row_parts, row_hi = n * (part + 1) / row_parts;
        const int64_t c0 = block * kBlock, c1 = std::min(inner, c0 + kBlock);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t row = idx[j];
          if (row == skip || row < row_lo || row >= row_hi) continue;
          T* dst = d + (o * n + row) * inner;
          const T* from = s + (o * k + j) * inner;
          for (int64_t c = c0; c < c1; ++c) dst[c] += from[c];
        }
      }
    });
  });
}

// Runs body(bases, count) over blocks of fibers along `dim` of `shape` (fibers numbered
// row-major over the other dims); bases holds N element offsets per fiber, one per
// operand, for the fiber's element 0. Blocks of fibers are spread over threads.
template <int N, class Body>
void for_each_fiber_block(const Shape& shape, int64_t dim, const std::array<Shape, N>& strides, const Body& body) {
  const int64_t len = shape[dim];
  const int64_t fibers = shape.numel() / len;
  constexpr int64_t kFibersPerBlock = 256;
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / len);
  cpu::parallel_for(0, fibers, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> bases(static_cast<size_t>(kFibersPerBlock * N));
    // Coordinates of fiber `begin` (coordinate `dim` stays 0), then an odometer.
    Shape coords;
    coords.resize(shape.size(), 0);
    for (int64_t d = shape.size() - 1, rest = begin; d >= 0; --d) {
      if (d == dim) continue;
      coords[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (int64_t f0 = begin; f0 < end; f0 += kFibersPerBlock) {
      const int64_t count = std::min(kFibersPerBlock, end - f0);
      for (int64_t f = 0; f < count; ++f) {
        for (int i = 0; i < N; ++i) {
          int64_t off = 0;
          for (int64_t d = 0; d < shape.size(); ++d) off += coords[d] * strides[i][d];
          bases[f * N + i] = off;
        }
        for (int64_t d = shape.size() - 1; d >= 0; --d) {
          if (d == dim) continue;
          if (++coords[d] < shape[d]) break;
          coords[d] = 0;
        }
      }
      body(bases.data(), count);
    }
  });
}

void gather_kernel(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  const int64_t* idx = static_cast<const int64_t*>(index.raw_data());
  const Shape& shape = index.shape();
  const int64_t len = shape[dim];
  const int64_t idx_step = index.strides()[dim], out_step = out.strides()[dim], x_step = x.strides()[dim];
  dispatch_dtype(x.dtype(), DTypeSet::All, "gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = static_cast<const T*>(x.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    for_each_fiber_block<3>(shape, dim, {index.strides(), x.strides(), out.strides()},
                            [&](const int64_t* bases, int64_t count) {
                              for (int64_t j = 0; j < len; ++j)
                                for (int64_t f = 0; f < count; ++f) {
                                  const int64_t* b = bases + f * 3;
                                  dst[b[2] + j * out_step] = src[b[1] + idx[b[0] + j * idx_step] * x_step];
                                }
                            });
  });
}

void scatter_add_kernel(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t* idx = static_cast<const int64_t*>(index.raw_data());
  const Shape& shape = index.shape();
  const int64_t len = shape[dim];
  const int64_t idx_step = index.strides()[dim], src_step = src.strides()[dim], out_step = out.strides()[dim];
  dispatch_dtype(out.dtype(), DTypeSet::Numeric, "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* from = static_cast<const T*>(src.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    // j outermost keeps each destination's additions in index order (Note [Deterministic scatter]).
    for_each_fiber_block<3>(shape, dim, {index.strides(), src.strides(), out.strides()},
                            [&](const int64_t* bases, int64_t count) {
                              for (int64_t j = 0; j < len; ++j)
                                for (int64_t f = 0; f < count; ++f) {
                                  const int64_t* b = bases + f * 3;
                                  dst[b[2] + idx[b[0] + j * idx_step] * out_step] += from[b[1] + j * src_step];
                                }
                            });
  });
}

}  // namespace

void cpu::register_index_kernels() {
  index_range_stub.set(DeviceType::CPU, &index_range_kernel);
  index_select_stub.set(DeviceType::CPU, &index_select_kernel);
  index_add_stub.set(DeviceType::CPU, &index_add_kernel);
  gather_stub.set(DeviceType::CPU, &gather_kernel);
  scatter_add_stub.set(DeviceType::CPU, &scatter_add_kernel);
}

}  // namespace weft
