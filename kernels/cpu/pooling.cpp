// CPU pooling kernels (see kernels/pooling_kernels.h for the contract).
//
// Work is split over (n, c) planes: a forward plane reads one strided input plane and
// writes one output plane, a backward plane zero-fills and scatters into one
// grad_input plane, so no two threads ever write the same element and the result does
// not depend on the thread count. The window bounds along each dim depend only on the
// output position, so they are computed once per call, not once per plane.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/pooling_kernels.h"

namespace weft {

namespace {

// float64 accumulation for the averages, whatever the element type.
using Acc = double;

// Where (n, c) planes of a 4-d tensor start, for any strides.
struct Planes {
  int64_t count, channels, height, width;
  int64_t stride_n, stride_c, stride_h, stride_w;

  explicit Planes(const Tensor& t)
      : count(t.size(0) * t.size(1)),
        channels(t.size(1)),
        height(t.size(2)),
        width(t.size(3)),
        stride_n(t.stride(0)),
        stride_c(t.stride(1)),
        stride_h(t.stride(2)),
        stride_w(t.stride(3)) {}
  int64_t offset(int64_t plane) const { return (plane / channels) * stride_n + (plane % channels) * stride_c; }
};

// Runs body(plane) for every plane, `work` element visits per plane, across threads.
template <class F>
void for_each_plane(int64_t planes, int64_t work, const F& body) {
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(1, work));
  cpu::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) body(p);
  });
}

// One output position's taps along one dim: first, first + step, ... < end.
struct Taps {
  int64_t first, end, step;
  int64_t divisor_extent;  // avg pooling with count_include_pad: the window clipped to the padded input
};

// Max pooling: dilated taps; the ones in the padding are skipped (padding acts as -inf).
std::vector<Taps> max_taps(int64_t out, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  std::vector<Taps> taps(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = o * s - p;
    int64_t end = std::min(start + (k - 1) * d + 1, in);
    if (start < 0) start += (-start + d - 1) / d * d;
    taps[o] = {start, end, d, 0};
  }
  return taps;
}

// Average pooling: PyTorch's window, whose padded extent may be cut at in + p (ceil_mode).
std::vector<Taps> avg_taps(int64_t out, int64_t in, int64_t k, int64_t s, int64_t p) {
  std::vector<Taps> taps(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = o * s - p;
    int64_t end = std::min(start + k, in + p);
    taps[o] = {std::max<int64_t>(start, 0), std::min(end, in), 1, end - start};
  }
  return taps;
}

// Adaptive windows: [floor(o * in / out), ceil((o + 1) * in / out)).
std::vector<Taps> adaptive_taps(int64_t out, int64_t in) {
  std::vector<Taps> taps(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = o * in / out, end = ((o + 1) * in + out - 1) / out;
    taps[o] = {start, end, 1, end - start};
  }
  return taps;
}

int64_t tap_count(const Taps& t) { return t.end > t.first ? (t.end - t.first + t.step - 1) / t.step : 0; }

// The NaN a window reports: its last one, as PyTorch's CPU loop (where every NaN takes
// over) does. Returns (value, index in the plane).
template <class T>
std::pair<T, int64_t> last_nan(const T* src, const Taps& r, const Taps& c, int64_t width, int64_t stride_h,
                               int64_t stride_w) {
  std::pair<T, int64_t> found{T(0), -1};
  for (int64_t h = r.first; h < r.end; h += r.step)
    for (int64_t w = c.first; w < c.end; w += c.step)
      if (std::isnan(src[h * stride_h + w * stride_w])) found = {src[h * stride_h + w * stride_w], h * width + w};
  return found;
}

template <class T>
void max_pool_typed(const Tensor& input, const Tensor& out, const Tensor& indices, const Pool2dGeometry& g) {
  const Planes in(input);
  const int64_t oh = out.size(2), ow = out.size(3);
  auto rows = max_taps(oh, in.height, g.kernel[0], g.stride[0], g.padding[0], g.dilation[0]);
  auto cols = max_taps(ow, in.width, g.kernel[1], g.stride[1], g.padding[1], g.dilation[1]);
  const T* src_base = static_cast<const T*>(input.raw_data());
  T* dst_base = out.data_ptr<T>();
  int64_t* idx_base = indices.data_ptr<int64_t>();
  // Strides copied into locals: the compiler cannot keep members of a captured struct in
  // registers across the stores to dst / idx, which may alias them as far as it knows.
  const int64_t width = in.width, stride_h = in.stride_h, stride_w = in.stride_w;
  // The 2x2, stride-2 pool of most CNNs: four fixed loads per output, no tap tables. Only
  // where every window is whole: with ceil_mode on an odd size the last window is cut at
  // the edge, and the general loop below clips it.
  const bool two_by_two = g.kernel == std::array<int64_t, 2>{2, 2} && g.stride == std::array<int64_t, 2>{2, 2} &&
                          g.padding == std::array<int64_t, 2>{0, 0} && g.dilation == std::array<int64_t, 2>{1, 1} &&
                          stride_w == 1 && 2 * oh <= in.height && 2 * ow <= in.width;
  if (two_by_two) {
    for_each_plane(in.count, oh * ow * 4, [&](int64_t plane) {
      const T* src = src_base + in.offset(plane);
      T* dst = dst_base + plane * oh * ow;
      int64_t* idx = idx_base + plane * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        const T* top = src + 2 * i * stride_h;
        const T* bottom = top + stride_h;
        for (int64_t j = 0; j < ow; ++j) {
          // PyTorch's order (a, b, c, d), a later tap winning only when strictly greater,
          // computed as two pairs and a final pick: the same winner, with max and 0/1
          // arithmetic instead of branches that random data mispredicts half the time.
          const T a = top[2 * j], b = top[2 * j + 1], c = bottom[2 * j], d = bottom[2 * j + 1];
          const T upper = std::max(a, b), lower = std::max(c, d);  // max keeps the first on ties
          const int64_t upper_at = static_cast<int64_t>(b > a);
          const int64_t lower_at = width + static_cast<int64_t>(d > c);
          const int64_t lower_wins = static_cast<int64_t>(lower > upper);
          T best = std::max(upper, lower);
          int64_t at = upper_at + lower_wins * (lower_at - upper_at);
          if ((a != a) | (b != b) | (c != c) | (d != d)) [[unlikely]] {
            const Taps r{2 * i, 2 * i + 2, 1, 0}, col{2 * j, 2 * j + 2, 1, 0};
            std::tie(best, at) = last_nan(src, r, col, width, stride_h, stride_w);
            at -= 2 * i * width + 2 * j;
          }
          dst[i * ow + j] = best;
          idx[i * ow + j] = 2 * i * width + 2 * j + at;
        }
      }
    });
    return;
  }
  for_each_plane(in.count, oh * ow * g.kernel[0] * g.kernel[1], [&](int64_t plane) {
    const T* src = src_base + in.offset(plane);
    T* dst = dst_base + plane * oh * ow;
    int64_t* idx = idx_base + plane * oh * ow;
    for (int64_t i = 0; i < oh; ++i) {
      const Taps r = rows[i];
      for (int64_t j = 0; j < ow; ++j) {
        const Taps c = cols[j];
        // Among equal values the first tap wins (PyTorch's CPU order). Which tap wins is
        // unpredictable on real data, so the update is a max and a bit-mask select, not
        // a branch. A NaN wins (max would drop it): it is looked for again, rarely.
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_at = r.first * width + c.first;
        bool saw_nan = false;
        for (int64_t h = r.first; h < r.end; h += r.step) {
          for (int64_t w = c.first; w < c.end; w += c.step) {
            const T v = src[h * stride_h + w * stride_w];
            const int64_t take = -static_cast<int64_t>(v > best);
            best_at = ((h * width + w) & take) | (best_at & ~take);
            best = v > best ? v : best;
            saw_nan |= v != v;
          }
        }
        if (saw_nan) [[unlikely]]
          std::tie(best, best_at) = last_nan(src, r, c, width, stride_h, stride_w);
        dst[i * ow + j] = best;
        idx[i * ow + j] = best_at;
      }
    }
  });
}

template <class T>
void max_pool_backward_typed(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_input) {
  const Planes in(grad_input);
  const int64_t plane_out = grad_out.size(2) * grad_out.size(3), plane_in = in.height * in.width;
  const T* go_base = grad_out.data_ptr<T>();
  const int64_t* idx_base = indices.data_ptr<int64_t>();
  T* gi_base = grad_input.data_ptr<T>();
  for_each_plane(in.count, plane_in + plane_out, [&](int64_t plane) {
    const T* go = go_base + plane * plane_out;
    const int64_t* idx = idx_base + plane * plane_out;
    T* gi = gi_base + plane * plane_in;
    std::fill(gi, gi + plane_in, T(0));
    for (int64_t o = 0; o < plane_out; ++o) gi[idx[o]] += go[o];
  });
}

// Average pooling forward over per-dim windows; the divisor of a window is
// divisor(row_taps, col_taps).
template <class T, class Divisor>
void avg_forward(const Tensor& input, const Tensor& out, const std::vector<Taps>& rows, const std::vector<Taps>& cols,
                 int64_t window, Divisor divisor) {
  const Planes in(input);
  const int64_t oh = out.size(2), ow = out.size(3);
  const T* src_base = static_cast<const T*>(input.raw_data());
  T* dst_base = out.data_ptr<T>();
  for_each_plane(in.count, oh * ow * window, [&](int64_t plane) {
    const T* src = src_base + in.offset(plane);
    T* dst = dst_base + plane * oh * ow;
    for (int64_t i = 0; i < oh; ++i) {
      const Taps& r = rows[i];
      for (int64_t j = 0; j < ow; ++j) {
        const Taps& c = cols[j];
        Acc sum = 0;
        for (int64_t h = r.first; h < r.end; ++h)
          for (int64_t w = c.first; w < c.end; ++w) sum += src[h * in.stride_h + w * in.stride_w];
        int64_t n = divisor(r, c);
        dst[i * ow + j] = n > 0 ? static_cast<T>(sum / static_cast<Acc>(n)) : T(0);
      }
    }
  });
}

// The transpose of avg_forward: each output's gradient, divided by its divisor, is added
// to every input element of its window.
template <class T, class Divisor>
void avg_backward(const Tensor& grad_out, const Tensor& grad_input, const std::vector<Taps>& rows,
                  const std::vector<Taps>& cols, int64_t window, Divisor divisor) {
  const Planes in(grad_input);
  const int64_t oh = grad_out.size(2), ow = grad_out.size(3), plane_in = in.height * in.width;
  const T* go_base = grad_out.data_ptr<T>();
  T* gi_base = grad_input.data_ptr<T>();
  for_each_plane(in.count, plane_in + oh * ow * window, [&](int64_t plane) {
    const T* go = go_base + plane * oh * ow;
    T* gi = gi_base + plane * plane_in;
    std::fill(gi, gi + plane_in, T(0));
    for (int64_t i = 0; i < oh; ++i) {
      const Taps& r = rows[i];
      for (int64_t j = 0; j < ow; ++j) {
        const Taps& c = cols[j];
        int64_t n = divisor(r, c);
        if (n == 0) continue;
        T share = static_cast<T>(static_cast<Acc>(go[i * ow + j]) / static_cast<Acc>(n));
        for (int64_t h = r.first; h < r.end; ++h)
          for (int64_t w = c.first; w < c.end; ++w) gi[h * in.width + w] += share;
      }
    }
  });
}

int64_t padded_divisor(const Taps& r, const Taps& c) { return r.divisor_extent * c.divisor_extent; }
int64_t covered_divisor(const Taps& r, const Taps& c) { return tap_count(r) * tap_count(c); }

// The largest adaptive window along a dim: ceil(in / out) + 1 bounds it.
int64_t adaptive_window(int64_t in, int64_t out) { return (in + out - 1) / out + 1; }

void max_pool2d_kernel(const Tensor& input, const Tensor& out, const Tensor& indices, const Pool2dGeometry& g) {
  dispatch_floating(input.dtype(), "max_pool2d", [&](auto tag) {
    max_pool_typed<typename decltype(tag)::type>(input, out, indices, g);
  });
}

void max_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_input) {
  dispatch_floating(grad_out.dtype(), "max_pool2d backward", [&](auto tag) {
    max_pool_backward_typed<typename decltype(tag)::type>(grad_out, indices, grad_input);
  });
}

void avg_pool2d_kernel(const Tensor& input, const Tensor& out, const Pool2dGeometry& g, bool count_include_pad) {
  auto rows = avg_taps(out.size(2), input.size(2), g.kernel[0], g.stride[0], g.padding[0]);
  auto cols = avg_taps(out.size(3), input.size(3), g.kernel[1], g.stride[1], g.padding[1]);
  dispatch_floating(input.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_forward<T>(input, out, rows, cols, g.kernel[0] * g.kernel[1],
                   count_include_pad ? &padded_divisor : &covered_divisor);
  });
}

void avg_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& grad_input, const Pool2dGeometry& g,
                                bool count_include_pad) {
  auto rows = avg_taps(grad_out.size(2), grad_input.size(2), g.kernel[0], g.stride[0], g.padding[0]);
  auto cols = avg_taps(grad_out.size(3), grad_input.size(3), g.kernel[1], g.stride[1], g.padding[1]);
  dispatch_floating(grad_out.dtype(), "avg_pool2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_backward<T>(grad_out, grad_input, rows, cols, g.kernel[0] * g.kernel[1],
                    count_include_pad ? &padded_divisor : &covered_divisor);
  });
}

void adaptive_avg_pool2d_kernel(const Tensor& input, const Tensor& out) {
  const int64_t h = input.size(2), w = input.size(3), oh = out.size(2), ow = out.size(3);
  auto rows = adaptive_taps(oh, h);
  auto cols = adaptive_taps(ow, w);
  dispatch_floating(input.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    avg_forward<typename decltype(tag)::type>(input, out, rows, cols,
                                              adaptive_window(h, oh) * adaptive_window(w, ow), &covered_divisor);
  });
}

void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_out, const Tensor& grad_input) {
  const int64_t h = grad_input.size(2), w = grad_input.size(3), oh = grad_out.size(2), ow = grad_out.size(3);
  auto rows = adaptive_taps(oh, h);
  auto cols = adaptive_taps(ow, w);
  dispatch_floating(grad_out.dtype(), "adaptive_avg_pool2d backward", [&](auto tag) {
    avg_backward<typename decltype(tag)::type>(grad_out, grad_input, rows, cols,
                                               adaptive_window(h, oh) * adaptive_window(w, ow), &covered_divisor);
  });
}

}  // namespace

void cpu::register_pooling_kernels() {
  max_pool2d_stub.set(DeviceType::CPU, &max_pool2d_kernel);
  max_pool2d_backward_stub.set(DeviceType::CPU, &max_pool2d_backward_kernel);
  avg_pool2d_stub.set(DeviceType::CPU, &avg_pool2d_kernel);
  avg_pool2d_backward_stub.set(DeviceType::CPU, &avg_pool2d_backward_kernel);
  adaptive_avg_pool2d_stub.set(DeviceType::CPU, &adaptive_avg_pool2d_kernel);
  adaptive_avg_pool2d_backward_stub.set(DeviceType::CPU, &adaptive_avg_pool2d_backward_kernel);
}

}  // namespace weft
