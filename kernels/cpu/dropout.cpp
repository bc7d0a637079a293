// CPU dropout kernel: uniforms -> scaled mask (in place) and out = input * mask, in one
// pass over the three operands.
//
// Which elements survive is random, so a branch on it would mispredict half the time;
// the contiguous path is written as a select (kernels/dropout_mask.h, the rule the CUDA
// kernel uses too) over plain arrays, which the compiler turns into vector compares and
// blends.
#include <type_traits>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/loops.h"
#include "kernels/dropout_kernels.h"
#include "kernels/dropout_mask.h"

namespace weft {

namespace {

template <class T>
void dropout_typed(const Tensor& input, const Tensor& mask, const Tensor& out, double p) {
  const DropoutMask<T> rule = DropoutMask<T>::for_probability(p);
  if (input.is_contiguous()) {
    const T* x = static_cast<const T*>(input.raw_data());
    T* m = mask.data_ptr<T>();
    T* o = out.data_ptr<T>();
    cpu::parallel_for(0, out.numel(), cpu::kGrain, [&, rule](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T keep = rule(m[i]);
        m[i] = keep;
        o[i] = x[i] * keep;
      }
    });
    return;
  }
  auto ops = cpu::make_operands<3>(out.shape(), {&out, &mask, &input});
  cpu::for_each_run<3>(ops, [rule](std::array<char*, 3> ptr, std::array<int64_t, 3> stride, int64_t len) {
    for (int64_t i = 0; i < len; ++i) {
      T& m = *reinterpret_cast<T*>(ptr[1] + i * stride[1]);
      m = rule(m);
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

void cpu::register_dropout_kernels() {
  dropout_stub.set(DeviceType::CPU, &dropout_kernel);
}

}  // namespace weft
