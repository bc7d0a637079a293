// CPU dropout kernel: uniforms -> scaled mask (in place) and out = input * mask, in one
// pass over the three operands.
//
// Which elements survive is random, so a branch on it would mispredict half the time;
// the contiguous path is written as a select over plain arrays, which the compiler turns
// into vector compares and blends.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/dropout_kernels.h"

namespace weft {

namespace {

// The smallest T not below p: for u of type T, u >= p exactly when u >= threshold, so
// the comparison can run in T (float32 lanes) without changing which elements survive.
template <class T>
T keep_threshold(double p) {
  T t = static_cast<T>(p);
  if (static_cast<double>(t) < p) t = std::nextafter(t, std::numeric_limits<T>::infinity());
  return t;
}

template <class T>
void dropout_typed(const Tensor& input, const Tensor& mask, const Tensor& out, double p) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const T threshold = keep_threshold<T>(p);
  if (input.is_contiguous()) {
    const T* x = static_cast<const T*>(input.raw_data());
    T* m = mask.data_ptr<T>();
    T* o = out.data_ptr<T>();
    cpu::parallel_for(0, out.numel(), cpu::kGrain, [&, scale, threshold](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T keep = m[i] >= threshold ? scale : T(0);
        m[i] = keep;
        o[i] = x[i] * keep;
      }
    });
    return;
  }
  auto ops = cpu::make_operands<3>(out.shape(), {&out, &mask, &input});
  cpu::for_each_run<3>(ops, [scale, threshold](std::array<char*, 3> ptr, std::array<int64_t, 3> stride, int64_t len) {
    for (int64_t i = 0; i < len; ++i) {
      T& m = *reinterpret_cast<T*>(ptr[1] + i * stride[1]);
      m = m >= threshold ? scale : T(0);
      *reinterpret_cast<T*>(ptr[0] + i * stride[0]) = *reinterpret_cast<const T*>(ptr[2] + i * stride[2]) * m;
    }
  });
}

void dropout_kernel(const Tensor& input, const Tensor& mask, const Tensor& out, double p) {
  dispatch_dtype(input.dtype(), DTypeSet::Floating, "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) dropout_typed<T>(input, mask, out, p);
  });
}

}  // namespace

DispatchStub<DropoutFn> dropout_stub{"dropout", &dropout_kernel};

}  // namespace weft
