// CUDA pooling kernels (see kernels/pooling_kernels.h for the contract).
//
// Hand-written rather than cuDNN: none of the six stubs maps onto cuDNN exactly. Max
// pooling must return indices (cuDNN's has none) and its backward gets only those
// indices; cuDNN's pooling backward wants the forward's input and output, which the
// backward stubs do not receive, and is nondeterministic for max; the averages of the
// CPU kernels sum in float64 whatever the dtype, and their windows may be cut short at
// the padded border (ceil_mode) or be uneven (adaptive), which cuDNN's fixed-divisor
// windows cannot express.
//
// Each kernel computes every output element the way the CPU loop does, in the same
// order, so the results equal the CPU's bit for bit: forwards take one thread per output
// element; the average backwards gather, one thread per grad_input element visiting the
// windows that cover it in the CPU's (row-major) order; max backward scatters by index,
// one warp per (n, c) plane, adding colliding gradients in output order (see
// scatter_max_grad). Nothing uses atomics, so every run gives the same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/pooling_kernels.h"

namespace weft::cuda {

namespace {

// A 4-d tensor's sizes and element strides, for reading an input of any layout.
struct Strided4d {
  int64_t channels, height, width;
  int64_t stride_n, stride_c, stride_h, stride_w;

  explicit Strided4d(const Tensor& t)
      : channels(t.size(1)), height(t.size(2)), width(t.size(3)), stride_n(t.stride(0)), stride_c(t.stride(1)),
        stride_h(t.stride(2)), stride_w(t.stride(3)) {}

  // Offset of plane p = n * C + c.
  __device__ int64_t plane(int64_t p) const { return (p / channels) * stride_n + (p % channels) * stride_c; }
};

// A window along one dim: first, first + step, ... < end.
struct Window {
  int64_t first, end;
};

// Max pooling's dilated window; taps in the padding are skipped (padding acts as -inf).
__device__ __forceinline__ Window max_window(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  int64_t start = o * s - p;
  const int64_t end = min(start + (k - 1) * d + 1, in);
  if (start < 0) start += (-start + d - 1) / d * d;
  return {start, end};
}

// Average pooling's window (PyTorch's): its padded extent, cut at in + p, gives the
// count_include_pad divisor; the part inside the input is summed.
struct AvgWindow {
  int64_t first, end;  // inside the input
  int64_t padded;      // extent within [-p, in + p)
};

__device__ __forceinline__ AvgWindow avg_window(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p) {
  const int64_t start = o * s - p;
  const int64_t end = min(start + k, in + p);
  return {max(start, int64_t{0}), min(end, in), end - start};
}

// Adaptive windows: [floor(o * in / out), ceil((o + 1) * in / out)).
__device__ __forceinline__ Window adaptive_window(int64_t o, int64_t in, int64_t out) {
  return {o * in / out, ((o + 1) * in + out - 1) / out};
}

__device__ __forceinline__ int64_t count(int64_t first, int64_t end) { return end > first ? end - first : 0; }

template <class T>
void launch_max_pool(const Tensor& input, const Tensor& out, const Tensor& indices, const Pool2dGeometry& g,
                     cudaStream_t stream) {
  const Strided4d in(input);
  const int64_t oh = out.size(2), ow = out.size(3);
  const T* src = static_cast<const T*>(input.raw_data());
  T* dst = out.data_ptr<T>();
  int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t kh = g.kernel[0], kw = g.kernel[1], sh = g.stride[0], sw = g.stride[1];
  const int64_t ph = g.padding[0], pw = g.padding[1], dh = g.dilation[0], dw = g.dilation[1];
  for_each_index("max_pool2d", out.numel(), stream, [=] __device__(int64_t i) {
    const int64_t j = i % ow, r = (i / ow) % oh, p = i / (ow * oh);
    const T* plane = src + in.plane(p);
    const Window rows = max_window(r, in.height, kh, sh, ph, dh);
    const Window cols = max_window(j, in.width, kw, sw, pw, dw);
    // As on the CPU: the first of equal maxima wins; with no tap at all (a window that
    // only covers padding) the index is that of the window's first position.
    T best = -std::numeric_limits<T>::infinity();
    int64_t best_at = rows.first * in.width + cols.first;
    bool saw_nan = false;
    for (int64_t h = rows.first; h < rows.end; h += dh)
      for (int64_t w = cols.first; w < cols.end; w += dw) {
        const T v = plane[h * in.stride_h + w * in.stride_w];
        if (v > best) {
          best = v;
          best_at = h * in.width + w;
        }
        saw_nan |= v != v;
      }
    if (saw_nan) {  // a NaN wins, the window's last one (PyTorch's CPU order)
      for (int64_t h = rows.first; h < rows.end; h += dh)
        for (int64_t w = cols.first; w < cols.end; w += dw) {
          const T v = plane[h * in.stride_h + w * in.stride_w];
          if (v != v) {
            best = v;
            best_at = h * in.width + w;
          }
        }
    }
    dst[i] = best;
    idx[i] = best_at;
  });
}

constexpr int kWarp = 32;

// Note [Deterministic max-pool scatter]: grad_input[idx[o]] += grad_out[o] for every o of
// a plane, in increasing o, as the CPU does. One warp owns a plane and takes its outputs
// 32 at a time; lanes whose indices collide (overlapping windows) form a group, and the
// group's lowest lane adds the group's values in lane order, which is output order,
// after the earlier chunks (same warp, ordered by __syncwarp). So every element gets the
// CPU's additions in the CPU's order, and no two lanes ever write the same element.
// grad_input is zeroed before. An index outside the plane (the CPU's position for a
// window with no taps) is skipped rather than written out of bounds.
template <class T>
__global__ void scatter_max_grad(const T* grad_out, const int64_t* indices, T* grad_input, int64_t planes,
                                 int64_t plane_out, int64_t plane_in) {
  __shared__ T staged[kBlockSize];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  T* warp_staged = staged + (threadIdx.x - lane);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  // The loop bounds are the same for the 32 lanes, so every lane reaches every
  // __match_any_sync / __syncwarp below with the full mask.
  for (int64_t p = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; p < planes; p += warps) {
    const T* go = grad_out + p * plane_out;
    const int64_t* idx = indices + p * plane_out;
    T* gi = grad_input + p * plane_in;
    for (int64_t base = 0; base < plane_out; base += kWarp) {
      const int64_t o = base + lane;
      const bool active = o < plane_out;
      const int64_t at = active ? idx[o] : -1;
      warp_staged[lane] = active ? go[o] : T(0);
      __syncwarp();
      const unsigned group = __match_any_sync(0xffffffffu, static_cast<unsigned long long>(at));
      if (active && at >= 0 && at < plane_in && lane == __ffs(group) - 1) {
        T acc = gi[at];
        for (unsigned rest = group; rest != 0; rest &= rest - 1) acc += warp_staged[__ffs(rest) - 1];
        gi[at] = acc;
      }
      __syncwarp();
    }
  }
}

template <class T>
void launch_max_pool_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_input,
                              cudaStream_t stream) {
  const int64_t planes = grad_input.size(0) * grad_input.size(1);
  const int64_t plane_in = grad_input.size(2) * grad_input.size(3);
  const int64_t plane_out = grad_out.size(2) * grad_out.size(3);
  WEFT_CUDA_CHECK(cudaMemsetAsync(grad_input.raw_data(), 0, grad_input.nbytes(), stream));
  if (planes == 0 || plane_out == 0) return;
  scatter_max_grad<T><<<grid_size(planes * kWarp), kBlockSize, 0, stream>>>(
      grad_out.data_ptr<T>(), indices.data_ptr<int64_t>(), grad_input.data_ptr<T>(), planes, plane_out, plane_in);
  WEFT_CUDA_CHECK_LAUNCH("max_pool2d_backward", stream);
}

template <class T>
void launch_avg_pool(const Tensor& input, const Tensor& out, const Pool2dGeometry& g, bool count_include_pad,
                     cudaStream_t stream) {
  const Strided4d in(input);
  const int64_t oh = out.size(2), ow = out.size(3);
  const T* src = static_cast<const T*>(input.raw_data());
  T* dst = out.data_ptr<T>();
  const int64_t kh = g.kernel[0], kw = g.kernel[1], sh = g.stride[0], sw = g.stride[1];
  const int64_t ph = g.padding[0], pw = g.padding[1];
  for_each_index("avg_pool2d", out.numel(), stream, [=] __device__(int64_t i) {
    const int64_t j = i % ow, r = (i / ow) % oh, p = i / (ow * oh);
    const T* plane = src + in.plane(p);
    const AvgWindow rows = avg_window(r, in.height, kh, sh, ph);
    const AvgWindow cols = avg_window(j, in.width, kw, sw, pw);
    double sum = 0;
    for (int64_t h = rows.first; h < rows.end; ++h)
      for (int64_t w = cols.first; w < cols.end; ++w)
        sum += static_cast<double>(plane[h * in.stride_h + w * in.stride_w]);
    const int64_t n = count_include_pad ? rows.padded * cols.padded
                                        : count(rows.first, rows.end) * count(cols.first, cols.end);
    dst[i] = n > 0 ? static_cast<T>(sum / static_cast<double>(n)) : T(0);
  });
}

// The transpose of launch_avg_pool, as a gather: grad_input[h, w] adds the share of
// every output whose window holds (h, w), outputs in row-major order as the CPU's
// scatter adds them. Output rows i with i * s - p <= h < i * s - p + k are those in
// [lo, hi] below; each is still tested against its exact window.
template <class T>
void launch_avg_pool_backward(const Tensor& grad_out, const Tensor& grad_input, const Pool2dGeometry& g,
                              bool count_include_pad, cudaStream_t stream) {
  const int64_t height = grad_input.size(2), width = grad_input.size(3);
  const int64_t oh = grad_out.size(2), ow = grad_out.size(3);
  const T* go_base = grad_out.data_ptr<T>();
  T* gi = grad_input.data_ptr<T>();
  const int64_t kh = g.kernel[0], kw = g.kernel[1], sh = g.stride[0], sw = g.stride[1];
  const int64_t ph = g.padding[0], pw = g.padding[1];
  for_each_index("avg_pool2d_backward", grad_input.numel(), stream, [=] __device__(int64_t e) {
    const int64_t w = e % width, h = (e / width) % height, p = e / (width * height);
    const T* go = go_base + p * oh * ow;
    const int64_t i_lo = h + ph >= kh ? (h + ph - kh) / sh + 1 : 0, i_hi = min((h + ph) / sh, oh - 1);
    const int64_t j_lo = w + pw >= kw ? (w + pw - kw) / sw + 1 : 0, j_hi = min((w + pw) / sw, ow - 1);
    T acc = T(0);
    for (int64_t i = i_lo; i <= i_hi; ++i) {
      const AvgWindow rows = avg_window(i, height, kh, sh, ph);
      if (h < rows.first || h >= rows.end) continue;
      for (int64_t j = j_lo; j <= j_hi; ++j) {
        const AvgWindow cols = avg_window(j, width, kw, sw, pw);
        if (w < cols.first || w >= cols.end) continue;
        const int64_t n = count_include_pad ? rows.padded * cols.padded
                                            : count(rows.first, rows.end) * count(cols.first, cols.end);
        if (n == 0) continue;
        acc += static_cast<T>(static_cast<double>(go[i * ow + j]) / static_cast<double>(n));
      }
    }
    gi[e] = acc;
  });
}

template <class T>
void launch_adaptive_avg_pool(const Tensor& input, const Tensor& out, cudaStream_t stream) {
  const Strided4d in(input);
  const int64_t oh = out.size(2), ow = out.size(3);
  const T* src = static_cast<const T*>(input.raw_data());
  T* dst = out.data_ptr<T>();
  for_each_index("adaptive_avg_pool2d", out.numel(), stream, [=] __device__(int64_t i) {
    const int64_t j = i % ow, r = (i / ow) % oh, p = i / (ow * oh);
    const T* plane = src + in.plane(p);
    const Window rows = adaptive_window(r, in.height, oh), cols = adaptive_window(j, in.width, ow);
    double sum = 0;
    for (int64_t h = rows.first; h < rows.end; ++h)
      for (int64_t w = cols.first; w < cols.end; ++w)
        sum += static_cast<double>(plane[h * in.stride_h + w * in.stride_w]);
    const int64_t n = count(rows.first, rows.end) * count(cols.first, cols.end);
    dst[i] = n > 0 ? static_cast<T>(sum / static_cast<double>(n)) : T(0);
  });
}

// Gather form as for launch_avg_pool_backward. Output rows i whose adaptive window holds
// h are those with floor(h * OH / H) <= i <= ((h + 1) * OH - 1) / H.
template <class T>
void launch_adaptive_avg_pool_backward(const Tensor& grad_out, const Tensor& grad_input, cudaStream_t stream) {
  const int64_t height = grad_input.size(2), width = grad_input.size(3);
  const int64_t oh = grad_out.size(2), ow = grad_out.size(3);
  const T* go_base = grad_out.data_ptr<T>();
  T* gi = grad_input.data_ptr<T>();
  for_each_index("adaptive_avg_pool2d_backward", grad_input.numel(), stream, [=] __device__(int64_t e) {
    const int64_t w = e % width, h = (e / width) % height, p = e / (width * height);
    const T* go = go_base + p * oh * ow;
    const int64_t i_lo = h * oh / height, i_hi = min(((h + 1) * oh - 1) / height, oh - 1);
    const int64_t j_lo = w * ow / width, j_hi = min(((w + 1) * ow - 1) / width, ow - 1);
    T acc = T(0);
    for (int64_t i = i_lo; i <= i_hi; ++i) {
      const Window rows = adaptive_window(i, height, oh);
      if (h < rows.first || h >= rows.end) continue;
      for (int64_t j = j_lo; j <= j_hi; ++j) {
        const Window cols = adaptive_window(j, width, ow);
        if (w < cols.first || w >= cols.end) continue;
        const int64_t n = count(rows.first, rows.end) * count(cols.first, cols.end);
        acc += static_cast<T>(static_cast<double>(go[i * ow + j]) / static_cast<double>(n));
      }
    }
    gi[e] = acc;
  });
}

void max_pool2d_kernel(const Tensor& input, const Tensor& out, const Tensor& indices, const Pool2dGeometry& g) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  dispatch_floating(input.dtype(), "max_pool2d", [&](auto tag) {
    launch_max_pool<typename decltype(tag)::type>(input, out, indices, g, stream);
  });
}

void max_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_input) {
  DeviceGuard guard(grad_input.device());
  cudaStream_t stream = stream_of(grad_input.device());
  dispatch_floating(grad_out.dtype(), "max_pool2d backward", [&](auto tag) {
    launch_max_pool_backward<typename decltype(tag)::type>(grad_out, indices, grad_input, stream);
  });
}

void avg_pool2d_kernel(const Tensor& input, const Tensor& out, const Pool2dGeometry& g, bool count_include_pad) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  dispatch_floating(input.dtype(), "avg_pool2d", [&](auto tag) {
    launch_avg_pool<typename decltype(tag)::type>(input, out, g, count_include_pad, stream);
  });
}

void avg_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& grad_input, const Pool2dGeometry& g,
                                bool count_include_pad) {
  DeviceGuard guard(grad_input.device());
  cudaStream_t stream = stream_of(grad_input.device());
  dispatch_floating(grad_out.dtype(), "avg_pool2d backward", [&](auto tag) {
    launch_avg_pool_backward<typename decltype(tag)::type>(grad_out, grad_input, g, count_include_pad, stream);
  });
}

void adaptive_avg_pool2d_kernel(const Tensor& input, const Tensor& out) {
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  dispatch_floating(input.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    launch_adaptive_avg_pool<typename decltype(tag)::type>(input, out, stream);
  });
}

void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& grad_input) {
  DeviceGuard guard(grad_input.device());
  cudaStream_t stream = stream_of(grad_input.device());
  dispatch_floating(grad_out.dtype(), "adaptive_avg_pool2d backward", [&](auto tag) {
    launch_adaptive_avg_pool_backward<typename decltype(tag)::type>(grad_out, grad_input, stream);
  });
}

}  // namespace

void register_pooling_kernels() {
  max_pool2d_stub.set(DeviceType::CUDA, &max_pool2d_kernel);
  max_pool2d_backward_stub.set(DeviceType::CUDA, &max_pool2d_backward_kernel);
  avg_pool2d_stub.set(DeviceType::CUDA, &avg_pool2d_kernel);
  avg_pool2d_backward_stub.set(DeviceType::CUDA, &avg_pool2d_backward_kernel);
  adaptive_avg_pool2d_stub.set(DeviceType::CUDA, &adaptive_avg_pool2d_kernel);
  adaptive_avg_pool2d_backward_stub.set(DeviceType::CUDA, &adaptive_avg_pool2d_backward_kernel);
}

}  // namespace weft::cuda
