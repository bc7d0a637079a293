// Kernel signatures of the indexing family, shared by the CPU and CUDA backends.
//
// Arguments arrive checked: index tensors are contiguous int64, the value tensors share
// one dtype and all tensors live on one device, and every index was scanned by
// index_range_stub. On the CPU that scan has already thrown for an index out of range;
// on CUDA it only recorded it (Note [Device-side errors], kernels/cuda/device_error_record.h),
// so the CUDA kernels skip such an index (a selected or gathered element reads 0, an added
// one is dropped) instead of dereferencing it. Kernels that
// accumulate (index_add, scatter_add) must give each destination element its
// contributions in index order, whatever the thread count, so that a training run is
// reproducible bit for bit: the CPU backend partitions the work by destination.
#pragma once

#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace weft {

// What a scan of an index tensor found: its min and max, and the flat position and value
// of the first entry outside [0, bound) (first_bad = -1 when all are inside). index is
// non-empty. `op` (a string literal) names the op in a deferred report. Unless the caller
// needs the values on the host (need_values: one_hot infers its class count from max), a
// backend may defer the check instead of waiting for it: CUDA records an entry out of
// range on the device, to be raised at the next synchronisation, and returns deferred =
// true with nothing else filled in. The CPU always answers at once.
struct IndexRange {
  int64_t min = 0;
  int64_t max = 0;
  int64_t first_bad = -1;
  int64_t bad_value = 0;
  bool deferred = false;
};
using IndexRangeFn = IndexRange(const Tensor& index, int64_t bound, const char* op, bool need_values);

// x contiguous, read as [outer, n, inner]; out contiguous [outer, k, inner], where k is
// index.numel(): out[o, j, i] = x[o, index[j], i].
using IndexSelectFn = void(const Tensor& x, const Tensor& index, const Tensor& out, int64_t outer, int64_t n,
                           int64_t inner);

// The backward of index_select and embedding. out contiguous [outer, n, inner] (already
// holding the values to add to), src contiguous [outer, k, inner]:
// out[o, index[j], i] += src[o, j, i] for every j with index[j] != skip (skip < 0: none).
using IndexAddFn = void(const Tensor& src, const Tensor& index, const Tensor& out, int64_t outer, int64_t n,
                        int64_t inner, int64_t skip);

// torch.gather: x any strides, out contiguous with index's shape, all of rank >= 1.
using GatherFn = void(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);

// torch.scatter_add_ into out (any strides, rank >= 1); src any strides, read at index's
// positions only.
using ScatterAddFn = void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

extern DispatchStub<IndexRangeFn> index_range_stub;
extern DispatchStub<IndexSelectFn> index_select_stub;
extern DispatchStub<IndexAddFn> index_add_stub;
extern DispatchStub<GatherFn> gather_stub;
extern DispatchStub<ScatterAddFn> scatter_add_stub;

}  // namespace weft
