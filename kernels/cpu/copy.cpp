// CPU copy (with dtype conversion and broadcasting) and fill.
#include <cstring>

#include "core/copy.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/loops.h"
#include "kernels/host_device_math.h"

namespace weft {

namespace {

using hd::convert;  // Note [Converting between dtypes]

void copy_kernel(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
    std::memcpy(dst.raw_data(), src.raw_data(), static_cast<size_t>(dst.nbytes()));
    return;
  }
  auto ops = cpu::make_operands<2>(dst.shape(), {&dst, &src});
  dispatch_storage_dtype(dst.dtype(), "copy_", [&](auto dst_tag) {
    using To = typename decltype(dst_tag)::type;
    dispatch_storage_dtype(src.dtype(), "copy_", [&](auto src_tag) {
      using From = typename decltype(src_tag)::type;
      cpu::for_each_run<2>(ops, [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
          To* out = reinterpret_cast<To*>(p[0]);
          const From* in = reinterpret_cast<const From*>(p[1]);
          for (int64_t i = 0; i < n; ++i) out[i] = convert<To>(in[i]);
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<To*>(p[0] + i * s[0]) = convert<To>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
        }
      });
    });
  });
}

void fill_kernel(const Tensor& dst, double value) {
  auto ops = cpu::make_operands<1>(dst.shape(), {&dst});
  dispatch_storage_dtype(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = convert<T>(value);
    cpu::for_each_run<1>(ops, [v](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

}  // namespace

void cpu::register_copy_kernels() {
  copy_stub.set(DeviceType::CPU, &copy_kernel);
  fill_stub.set(DeviceType::CPU, &fill_kernel);
}

}  // namespace weft
