// CPU batch normalisation kernels (see kernels/batch_norm_kernels.h for the contract).
//
// Statistics and backward sums run one channel per task: a channel's N * S values are
// visited in one fixed order by one thread, so the results do not depend on the thread
// count. Sums accumulate in float64 whatever the element type. The statistics use one
// pass with a shift (the channel's first value): sums of (x - shift) and (x - shift)^2
// keep the variance accurate when the mean is large next to the spread, which the
// plain sum-of-squares formula does not. What follows the sums is
// kernels/batch_norm_math.h, shared with the CUDA kernels.
#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/batch_norm_kernels.h"
#include "kernels/batch_norm_math.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/parallel.h"

namespace weft {

namespace {

using Acc = double;

// The [N, C, S] layout of a contiguous input.
struct Layout {
  int64_t n, channels, spatial;
  explicit Layout(const Tensor& t) : n(t.size(0)), channels(t.size(1)), spatial(t.size(2)) {}
  int64_t per_channel() const { return n * spatial; }
  // First element of batch row b in channel c.
  int64_t row(int64_t b, int64_t c) const { return (b * channels + c) * spatial; }
};

// Reads a 1-d per-channel tensor of any stride; `fallback` when undefined.
template <class T>
struct ChannelReader {
  const T* data = nullptr;
  int64_t stride = 0;
  Acc fallback;
  ChannelReader(const Tensor& t, Acc fallback_value) : fallback(fallback_value) {
    if (t.defined()) data = static_cast<const T*>(t.raw_data()), stride = t.stride(0);
  }
  Acc operator[](int64_t c) const { return data ? static_cast<Acc>(data[c * stride]) : fallback; }
};

template <class T>
T& channel_at(const Tensor& t, int64_t c) {
  return static_cast<T*>(t.raw_data())[c * t.stride(0)];
}

// Channel-parallel loop: each task handles whole channels of `per_channel` values.
template <class F>
void for_each_channel(int64_t channels, int64_t per_channel, const F& body) {
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(1, per_channel));
  cpu::parallel_for(0, channels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) body(c);
  });
}

// Adds sum_i u(i) and sum_i v(i), i < n, to sum_u and sum_v, where terms(i) returns
// {u(i), v(i)}. Four lanes of accumulators keep the float64 adds from waiting on each
// other; the lanes combine in a fixed order, so the result is still one deterministic
// function of the row.
template <class F>
void add_two_sums(int64_t n, const F& terms, Acc& sum_u, Acc& sum_v) {
  constexpr int kLanes = 4;
  Acc u[kLanes] = {}, v[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      auto [a, b] = terms(i + k);
      u[k] += a;
      v[k] += b;
    }
  }
  for (; i < n; ++i) {
    auto [a, b] = terms(i);
    u[0] += a;
    v[0] += b;
  }
  sum_u += (u[0] + u[1]) + (u[2] + u[3]);
  sum_v += (v[0] + v[1]) + (v[2] + v[3]);
}

template <class T>
void stats_typed(const Tensor& input, const Tensor& mean, const Tensor& var, const Tensor& running_mean,
                 const Tensor& running_var, double momentum) {
  const Layout l(input);
  const T* x = input.data_ptr<T>();
  const Acc count = static_cast<Acc>(l.per_channel());
  for_each_channel(l.channels, l.per_channel(), [&](int64_t c) {
    const Acc shift = x[l.row(0, c)];
    Acc s1 = 0, s2 = 0;
    for (int64_t b = 0; b < l.n; ++b) {
      const T* row = x + l.row(b, c);
      add_two_sums(
          l.spatial,
          [row, shift](int64_t s) {
            Acc d = static_cast<Acc>(row[s]) - shift;
            return std::pair<Acc, Acc>{d, d * d};
          },
          s1, s2);
    }
    const BatchNormMoments moments = batch_norm_moments(shift, s1, s2, count);
    channel_at<T>(mean, c) = static_cast<T>(moments.mean);
    channel_at<T>(var, c) = static_cast<T>(moments.var);
    if (running_mean.defined()) {
      T& rm = channel_at<T>(running_mean, c);
      T& rv = channel_at<T>(running_var, c);
      rm = static_cast<T>(batch_norm_running_mean(static_cast<Acc>(rm), moments.mean, momentum));
      rv = static_cast<T>(batch_norm_running_var(static_cast<Acc>(rv), moments.var, count, momentum));
    }
  });
}

template <class T>
void forward_typed(const Tensor& input, const Tensor& mean, const Tensor& var, double eps, const Tensor& weight,
                   const Tensor& bias, const Tensor& out) {
  const Layout l(input);
  // y = (x - mean) * scale + bias, with per-channel constants (kernels/batch_norm_math.h).
  std::vector<T> centre(l.channels), scale(l.channels), shift(l.channels);
  ChannelReader<T> m(mean, 0), v(var, 0), w(weight, 1), bi(bias, 0);
  for (int64_t c = 0; c < l.channels; ++c) {
    centre[c] = static_cast<T>(m[c]);
    scale[c] = static_cast<T>(batch_norm_scale(w[c], v[c], eps));
    shift[c] = static_cast<T>(bi[c]);
  }
  const T* x = input.data_ptr<T>();
  T* y = out.data_ptr<T>();
  const int64_t rows = l.n * l.channels;
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(1, l.spatial));
  cpu::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t c = r % l.channels;
      const T mu = centre[c], a = scale[c], b = shift[c];
      const T* xr = x + r * l.spatial;
      T* yr = y + r * l.spatial;
      for (int64_t s = 0; s < l.spatial; ++s) yr[s] = batch_norm_normalize(xr[s], mu, a, b);
    }
  });
}

template <class T>
void backward_typed(const Tensor& grad_out, const Tensor& input, const Tensor& mean, const Tensor& var, double eps,
                    const Tensor& weight, bool training, const Tensor& grad_input, const Tensor& grad_weight,
                    const Tensor& grad_bias) {
  const Layout l(input);
  const T* x = input.data_ptr<T>();
  const T* g = grad_out.data_ptr<T>();
  T* gi = grad_input.defined() ? grad_input.data_ptr<T>() : nullptr;
  ChannelReader<T> m(mean, 0), v(var, 0), w(weight, 1);
  const bool need_sums = training || grad_weight.defined() || grad_bias.defined();
  const Acc count = static_cast<Acc>(l.per_channel());
  for_each_channel(l.channels, l.per_channel(), [&](int64_t c) {
    const Acc mu = m[c];
    Acc sum_g = 0, sum_gd = 0;  // sum g and sum g * (x - mean)
    if (need_sums) {
      for (int64_t b = 0; b < l.n; ++b) {
        const T* xr = x + l.row(b, c);
        const T* gr = g + l.row(b, c);
        add_two_sums(
            l.spatial,
            [xr, gr, mu](int64_t s) {
              Acc gs = gr[s];
              return std::pair<Acc, Acc>{gs, gs * (static_cast<Acc>(xr[s]) - mu)};
            },
            sum_g, sum_gd);
      }
    }
    // grad_input = a * g + bx * (x - mean) + k: the training terms fold into per-channel
    // constants.
    const BatchNormBackwardCoefficients coeffs =
        batch_norm_backward_coefficients(w[c], v[c], eps, sum_g, sum_gd, count, training);
    if (grad_bias.defined()) channel_at<T>(grad_bias, c) = static_cast<T>(sum_g);
    if (grad_weight.defined()) channel_at<T>(grad_weight, c) = static_cast<T>(coeffs.grad_weight);
    if (gi == nullptr) return;
    const BatchNormInputGrad grad_of = coeffs.input;
    for (int64_t b = 0; b < l.n; ++b) {
      const T* xr = x + l.row(b, c);
      const T* gr = g + l.row(b, c);
      T* out = gi + l.row(b, c);
      for (int64_t s = 0; s < l.spatial; ++s)
        out[s] = static_cast<T>(grad_of(static_cast<Acc>(gr[s]), static_cast<Acc>(xr[s]) - mu));
    }
  });
}

void stats_kernel(const Tensor& input, const Tensor& mean, const Tensor& var, const Tensor& running_mean,
                  const Tensor& running_var, double momentum) {
  dispatch_floating(input.dtype(), "batch_norm", [&](auto tag) {
    stats_typed<typename decltype(tag)::type>(input, mean, var, running_mean, running_var, momentum);
  });
}

void forward_kernel(const Tensor& input, const Tensor& mean, const Tensor& var, double eps, const Tensor& weight,
                    const Tensor& bias, const Tensor& out) {
  dispatch_floating(input.dtype(), "batch_norm", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(input, mean, var, eps, weight, bias, out);
  });
}

void backward_kernel(const Tensor& grad_out, const Tensor& input, const Tensor& mean, const Tensor& var, double eps,
                     const Tensor& weight, bool training, const Tensor& grad_input, const Tensor& grad_weight,
                     const Tensor& grad_bias) {
  dispatch_floating(input.dtype(), "batch_norm backward", [&](auto tag) {
    backward_typed<typename decltype(tag)::type>(grad_out, input, mean, var, eps, weight, training, grad_input,
                                                 grad_weight, grad_bias);
  });
}

}  // namespace

void cpu::register_batch_norm_kernels() {
  batch_norm_stats_stub.set(DeviceType::CPU, &stats_kernel);
  batch_norm_forward_stub.set(DeviceType::CPU, &forward_kernel);
  batch_norm_backward_stub.set(DeviceType::CPU, &backward_kernel);
}

}  // namespace weft
