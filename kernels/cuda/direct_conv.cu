// weft's direct CUDA convolution (see direct_conv.h).
//
// Each kernel is a grid-stride loop over the elements it writes; index arithmetic is in
// int64_t, so no tensor is too large for it (cuDNN's legacy API stops at INT_MAX elements,
// which is why conv.cpp calls in chunks of samples; these kernels simply follow along).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/direct_conv.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

// The geometry as the device reads it.
struct Dims {
  int64_t n, c, h, w, o, oh, ow, kh, kw;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t c_per_group, o_per_group;

  explicit Dims(const DirectConvGeometry& g)
      : n(g.n), c(g.channels), h(g.height), w(g.width), o(g.out_channels), oh(g.out_h), ow(g.out_w), kh(g.kh),
        kw(g.kw), sh(g.params.stride[0]), sw(g.params.stride[1]), ph(g.params.padding[0]),
        pw(g.params.padding[1]), dh(g.params.dilation[0]), dw(g.params.dilation[1]),
        c_per_group(g.channels / g.params.groups), o_per_group(g.out_channels / g.params.groups) {}
};

template <class T>
void forward(const T* x, const T* wt, T* y, const Dims d, cudaStream_t stream) {
  const int64_t n = d.n * d.o * d.oh * d.ow;
  for_each_index("conv2d (weft's direct kernel)", n, stream, [=] __device__(int64_t i) {
    const int64_t ox = i % d.ow, oy = (i / d.ow) % d.oh, o = (i / (d.ow * d.oh)) % d.o;
    const int64_t s = i / (d.ow * d.oh * d.o);
    const int64_t first_channel = o / d.o_per_group * d.c_per_group;
    T acc = 0;
    for (int64_t c = 0; c < d.c_per_group; ++c) {
      const T* plane = x + ((s * d.c + first_channel + c) * d.h) * d.w;
      const T* taps = wt + (o * d.c_per_group + c) * d.kh * d.kw;
      for (int64_t ki = 0; ki < d.kh; ++ki) {
        const int64_t iy = oy * d.sh - d.ph + ki * d.dh;
        if (iy < 0 || iy >= d.h) continue;
        for (int64_t kj = 0; kj < d.kw; ++kj) {
          const int64_t ix = ox * d.sw - d.pw + kj * d.dw;
          if (ix >= 0 && ix < d.w) acc += taps[ki * d.kw + kj] * plane[iy * d.w + ix];
        }
      }
    }
    y[i] = acc;
  });
}

// One thread per input element gathers from the outputs whose windows cover it.
template <class T>
void backward_input(const T* dy, const T* wt, T* dx, const Dims d, cudaStream_t stream) {
  const int64_t n = d.n * d.c * d.h * d.w;
  for_each_index("conv2d backward input (weft's direct kernel)", n, stream, [=] __device__(int64_t i) {
    const int64_t ix = i % d.w, iy = (i / d.w) % d.h, c = (i / (d.w * d.h)) % d.c;
    const int64_t s = i / (d.w * d.h * d.c);
    const int64_t group = c / d.c_per_group, c_in_group = c % d.c_per_group;
    T acc = 0;
    for (int64_t o = group * d.o_per_group; o < (group + 1) * d.o_per_group; ++o) {
      const T* plane = dy + ((s * d.o + o) * d.oh) * d.ow;
      const T* taps = wt + (o * d.c_per_group + c_in_group) * d.kh * d.kw;
      for (int64_t ki = 0; ki < d.kh; ++ki) {
        const int64_t ty = iy + d.ph - ki * d.dh;  // = oy * sh for the output row oy that reads iy
        if (ty < 0 || ty % d.sh != 0 || ty / d.sh >= d.oh) continue;
        for (int64_t kj = 0; kj < d.kw; ++kj) {
          const int64_t tx = ix + d.pw - kj * d.dw;
          if (tx < 0 || tx % d.sw != 0 || tx / d.sw >= d.ow) continue;
          acc += taps[ki * d.kw + kj] * plane[(ty / d.sh) * d.ow + tx / d.sw];
        }
      }
    }
    dx[i] = acc;
  });
}

// One thread per weight element sums over samples and output positions.
template <class T>
void backward_weight(const T* x, const T* dy, T* dwt, bool accumulate, const Dims d, cudaStream_t stream) {
  const int64_t n = d.o * d.c_per_group * d.kh * d.kw;
  for_each_index("conv2d backward weight (weft's direct kernel)", n, stream, [=] __device__(int64_t i) {
    const int64_t kj = i % d.kw, ki = (i / d.kw) % d.kh, c_in_group = (i / (d.kw * d.kh)) % d.c_per_group;
    const int64_t o = i / (d.kw * d.kh * d.c_per_group);
    const int64_t c = o / d.o_per_group * d.c_per_group + c_in_group;
    T acc = 0;
    for (int64_t s = 0; s < d.n; ++s) {
      const T* in = x + ((s * d.c + c) * d.h) * d.w;
      const T* grad = dy + ((s * d.o + o) * d.oh) * d.ow;
      for (int64_t oy = 0; oy < d.oh; ++oy) {
        const int64_t iy = oy * d.sh - d.ph + ki * d.dh;
        if (iy < 0 || iy >= d.h) continue;
        for (int64_t ox = 0; ox < d.ow; ++ox) {
          const int64_t ix = ox * d.sw - d.pw + kj * d.dw;
          if (ix >= 0 && ix < d.w) acc += grad[oy * d.ow + ox] * in[iy * d.w + ix];
        }
      }
    }
    dwt[i] = accumulate ? dwt[i] + acc : acc;
  });
}

// Calls f with a typed null pointer of the dtype's element type.
template <class F>
void with_element_type(DType dtype, const char* what, F f) {
  if (dtype == DType::Float32) return f(static_cast<float*>(nullptr));
  if (dtype == DType::Float64) return f(static_cast<double*>(nullptr));
  WEFT_FAIL(what, ": dtype ", dtype_name(dtype), " is not supported (expected float32 or float64)");
}

}  // namespace

void direct_conv2d_forward(DType dtype, const void* x, const void* w, void* y, const DirectConvGeometry& g,
                           Device device) {
  DeviceGuard guard(device);
  with_element_type(dtype, "direct conv2d forward", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    forward(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), Dims(g), stream_of(device));
  });
}

void direct_conv2d_backward_input(DType dtype, const void* dy, const void* w, void* dx, const DirectConvGeometry& g,
                                  Device device) {
  DeviceGuard guard(device);
  with_element_type(dtype, "direct conv2d backward (input)", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    backward_input(static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx), Dims(g),
                   stream_of(device));
  });
}

void direct_conv2d_backward_weight(DType dtype, const void* x, const void* dy, void* dw, bool accumulate,
                                   const DirectConvGeometry& g, Device device) {
  DeviceGuard guard(device);
  with_element_type(dtype, "direct conv2d backward (weight)", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    backward_weight(static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dw), accumulate, Dims(g),
                    stream_of(device));
  });
}

}  // namespace weft::cuda
