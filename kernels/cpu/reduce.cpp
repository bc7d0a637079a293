// CPU row reductions (see kernels/reduce_kernels.h for the [outer, inner] contract).
#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"
#include "kernels/reduce_kernels.h"

namespace weft {

namespace {

// Accumulator type: float64 for floating inputs, int64 for integers.
template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <class T>
void reduce_rows(ReduceOp op, const T* in, int64_t outer, int64_t inner, const Tensor& out, double correction) {
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(inner, 1));
  cpu::parallel_for(0, outer, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const T* row = in + o * inner;
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Mean: {
          Acc<T> acc = 0;
          for (int64_t i = 0; i < inner; ++i) acc += row[i];
          T* dst = static_cast<T*>(out.raw_data()) + o;
          *dst = op == ReduceOp::Sum ? static_cast<T>(acc) : static_cast<T>(static_cast<double>(acc) / inner);
          break;
        }
        default: break;
      }
    }
  });
  (void)correction;
}

void reduce_kernel(ReduceOp op, const Tensor& in, int64_t outer, int64_t inner, const Tensor& out,
                   double correction) {
  dispatch_dtype(in.dtype(), DTypeSet::Numeric, "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_rows<T>(op, static_cast<const T*>(in.raw_data()), outer, inner, out, correction);
  });
}

}  // namespace

DispatchStub<ReduceFn> reduce_stub{"reduce", &reduce_kernel};

}  // namespace weft
