// CUDA batch normalisation kernels (see kernels/batch_norm_kernels.h for the contract).
//
// Hand-written rather than cuDNN: cuDNN's training forward computes the statistics and
// the output in one call and keeps an inverse deviation, its backward recomputes or
// reuses those and knows only the training formula, and it refuses eps below 1e-5; the
// stubs split the work differently (statistics, then a forward from given mean and var,
// a backward for training or evaluation) and accept any eps >= 0.
//
// Per-channel sums (the statistics, and sum g, sum g * (x - mean) in backward) run in two
// deterministic steps, in float64 as on the CPU: each channel's N * S values are cut into
// chunks whose number depends only on the sizes, a block reduces one chunk in a fixed
// tree, and one thread per channel then adds its chunks' partials in order. So the result
// is the same on every run (it differs from the CPU's only in the order of the float64
// additions). Everything after the sums is the CPU's code (kernels/batch_norm_math.h);
// the elementwise passes read per-channel constants computed once per channel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/batch_norm_kernels.h"
#include "kernels/batch_norm_math.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

// Chunks hold at least this many values (16 per thread of a reduction block), and there
// are no more chunks in all than about kTargetBlocks unless the channels alone are more:
// enough blocks to fill a GPU, few enough partials for one thread per channel to add.
constexpr int kReduceBlock = 256;
constexpr int64_t kMinChunk = 16 * kReduceBlock;
constexpr int64_t kTargetBlocks = 1024;

// A per-channel tensor of any stride, read as float64; `fallback` when undefined.
template <class T>
struct ChannelIn {
  const T* data = nullptr;
  int64_t stride = 0;
  double fallback = 0;

  ChannelIn(const Tensor& t, double fallback_value) : fallback(fallback_value) {
    if (t.defined()) data = static_cast<const T*>(t.raw_data()), stride = t.stride(0);
  }
  __device__ double operator[](int64_t c) const { return data ? static_cast<double>(data[c * stride]) : fallback; }
};

// A per-channel output of any stride; writes are dropped when undefined.
template <class T>
struct ChannelOut {
  T* data = nullptr;
  int64_t stride = 0;

  explicit ChannelOut(const Tensor& t) {
    if (t.defined()) data = static_cast<T*>(t.raw_data()), stride = t.stride(0);
  }
  __device__ T& operator[](int64_t c) const { return data[c * stride]; }
  __device__ void set(int64_t c, double v) const {
    if (data) data[c * stride] = static_cast<T>(v);
  }
};

// The [N, C, S] layout of a contiguous input, and the chunks of its channels.
struct Layout {
  int64_t n, channels, spatial;
  int64_t chunks, chunk_len;

  explicit Layout(const Tensor& t) : n(t.size(0)), channels(t.size(1)), spatial(t.size(2)) {
    const int64_t m = per_channel();
    const int64_t by_size = (m + kMinChunk - 1) / kMinChunk;
    const int64_t by_blocks = (kTargetBlocks + channels - 1) / std::max<int64_t>(channels, 1);
    chunks = std::max<int64_t>(1, std::min(by_size, by_blocks));
    chunk_len = std::max<int64_t>(1, (m + chunks - 1) / chunks);
  }
  int64_t per_channel() const { return n * spatial; }
};

// Sums of the statistics: d and d^2 with d = x - shift, shift the channel's first value.
template <class T>
struct StatsTerms {
  const T* x;
  int64_t spatial;
  __device__ double channel_constant(int64_t c) const { return static_cast<double>(x[c * spatial]); }
  __device__ void add(double shift, int64_t at, double& u, double& v) const {
    const double d = static_cast<double>(x[at]) - shift;
    u += d;
    v += d * d;
  }
};

// Sums of backward: g and g * (x - mean).
template <class T>
struct BackwardTerms {
  const T* x;
  const T* g;
  ChannelIn<T> mean;
  __device__ double channel_constant(int64_t c) const { return mean[c]; }
  __device__ void add(double mu, int64_t at, double& u, double& v) const {
    const double gs = static_cast<double>(g[at]);
    u += gs;
    v += gs * (static_cast<double>(x[at]) - mu);
  }
};

// One block per (channel, chunk): the chunk's two sums, reduced over the block in a
// fixed tree, into partials[(c * chunks + chunk) * 2 + {0, 1}].
template <class Index, class Terms>
__global__ void __launch_bounds__(kReduceBlock)
    channel_sums_kernel(Terms terms, Index channels, Index spatial, Index per_channel, Index chunks, Index chunk_len,
                        double* partials) {
  const Index c = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const Index begin = chunk * chunk_len;
  const Index end = begin + chunk_len < per_channel ? begin + chunk_len : per_channel;
  const double k = per_channel > 0 ? terms.channel_constant(c) : 0.0;
  double u = 0, v = 0;
  for (Index e = begin + threadIdx.x; e < end; e += kReduceBlock) {
    const Index b = e / spatial, s = e - b * spatial;
    terms.add(k, (static_cast<int64_t>(b) * channels + c) * spatial + s, u, v);
  }
  constexpr int kWarps = kReduceBlock / 32;
  __shared__ double warp_u[kWarps], warp_v[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) {
    u += __shfl_down_sync(0xffffffffu, u, offset);
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_u[warp] = u, warp_v[warp] = v;
  __syncthreads();
  if (warp == 0) {
    u = lane < kWarps ? warp_u[lane] : 0.0;
    v = lane < kWarps ? warp_v[lane] : 0.0;
    for (int offset = kWarps / 2; offset > 0; offset /= 2) {
      u += __shfl_down_sync(0xffffffffu, u, offset);
      v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    if (lane == 0) {
      double* out = partials + 2 * (static_cast<int64_t>(c) * chunks + chunk);
      out[0] = u;
      out[1] = v;
    }
  }
}

// Fills partials (a float64 tensor of 2 * channels * chunks values) with each chunk's sums;
// `op` names the caller in a launch failure.
template <class Terms>
Tensor channel_sums(const char* op, const Terms& terms, const Layout& l, Device device, cudaStream_t stream) {
  Tensor partials = empty({2 * l.channels * l.chunks}, TensorOptions(DType::Float64, device));
  const int64_t blocks = l.channels * l.chunks;
  WEFT_CHECK(blocks <= INT32_MAX, "batch_norm: ", l.channels, " channels are more than a CUDA grid holds");
  double* out = partials.data_ptr<double>();
  if (l.n * l.channels * l.spatial <= INT32_MAX) {
    using I = uint32_t;
    channel_sums_kernel<I><<<static_cast<unsigned>(blocks), kReduceBlock, 0, stream>>>(
        terms, I(l.channels), I(l.spatial), I(l.per_channel()), I(l.chunks), I(l.chunk_len), out);
  } else {
    channel_sums_kernel<int64_t><<<static_cast<unsigned>(blocks), kReduceBlock, 0, stream>>>(
        terms, l.channels, l.spatial, l.per_channel(), l.chunks, l.chunk_len, out);
  }
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
  return partials;
}

// f(i, c) for every element i of a contiguous [N, C, S] tensor, c its channel. 32-bit
// index arithmetic when the tensor allows it: two divisions per element are most of the
// cost of these memory-bound passes, and 64-bit ones are several times slower.
template <class Index, class F>
__global__ void channel_map_kernel(Index n, Index spatial, Index channels, F f) {
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    f(static_cast<int64_t>(i), static_cast<int64_t>((i / spatial) % channels));
}

template <class F>
void for_each_element(const char* op, const Layout& l, cudaStream_t stream, F f) {
  const int64_t n = l.n * l.channels * l.spatial;
  if (n == 0) return;
  if (n <= INT32_MAX)
    channel_map_kernel<uint32_t><<<grid_size(n), kBlockSize, 0, stream>>>(uint32_t(n), uint32_t(l.spatial),
                                                                           uint32_t(l.channels), f);
  else
    channel_map_kernel<int64_t><<<grid_size(n), kBlockSize, 0, stream>>>(n, l.spatial, l.channels, f);
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
}

template <class T>
void stats_typed(const Tensor& input, const Tensor& mean, const Tensor& var, const Tensor& running_mean,
                 const Tensor& running_var, double momentum, cudaStream_t stream) {
  const Layout l(input);
  const T* x = input.data_ptr<T>();
  const Tensor partials = channel_sums("batch_norm_stats", StatsTerms<T>{x, l.spatial}, l, input.device(), stream);
  const double* p = partials.data_ptr<double>();
  const ChannelOut<T> m_out(mean), v_out(var), rm(running_mean), rv(running_var);
  const int64_t chunks = l.chunks, spatial = l.spatial;
  const double count = static_cast<double>(l.per_channel());
  for_each_index("batch_norm_stats", l.channels, stream, [=] __device__(int64_t c) {
    double s1 = 0, s2 = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      s1 += p[2 * (c * chunks + k)];
      s2 += p[2 * (c * chunks + k) + 1];
    }
    const BatchNormMoments moments = batch_norm_moments(static_cast<double>(x[c * spatial]), s1, s2, count);
    m_out.set(c, moments.mean);
    v_out.set(c, moments.var);
    if (rm.data) {
      rm[c] = static_cast<T>(batch_norm_running_mean(static_cast<double>(rm[c]), moments.mean, momentum));
      rv[c] = static_cast<T>(batch_norm_running_var(static_cast<double>(rv[c]), moments.var, count, momentum));
    }
  });
}

template <class T>
void forward_typed(const Tensor& input, const Tensor& mean, const Tensor& var, double eps, const Tensor& weight,
                   const Tensor& bias, const Tensor& out, cudaStream_t stream) {
  const Layout l(input);
  // Per channel, as on the CPU: centre = mean, scale = weight / sqrt(var + eps) and
  // shift = bias, each rounded to T once.
  Tensor constants = empty({3 * l.channels}, TensorOptions(input.dtype(), input.device()));
  T* k = constants.data_ptr<T>();
  const ChannelIn<T> m(mean, 0), v(var, 0), w(weight, 1), b(bias, 0);
  const int64_t channels = l.channels;
  for_each_index("batch_norm", channels, stream, [=] __device__(int64_t c) {
    k[c] = static_cast<T>(m[c]);
    k[channels + c] = static_cast<T>(batch_norm_scale(w[c], v[c], eps));
    k[2 * channels + c] = static_cast<T>(b[c]);
  });
  const T* x = input.data_ptr<T>();
  T* y = out.data_ptr<T>();
  for_each_element("batch_norm", l, stream, [=] __device__(int64_t i, int64_t c) {
    y[i] = batch_norm_normalize(x[i], k[c], k[channels + c], k[2 * channels + c]);
  });
}

template <class T>
void backward_typed(const Tensor& grad_out, const Tensor& input, const Tensor& mean, const Tensor& var, double eps,
                    const Tensor& weight, bool training, const Tensor& grad_input, const Tensor& grad_weight,
                    const Tensor& grad_bias, cudaStream_t stream) {
  const Layout l(input);
  const Device device = input.device();
  const T* x = input.data_ptr<T>();
  const T* g = grad_out.data_ptr<T>();
  const ChannelIn<T> m(mean, 0), v(var, 0), w(weight, 1);
  const bool need_sums = training || grad_weight.defined() || grad_bias.defined();
  Tensor partials;
  if (need_sums) partials = channel_sums("batch_norm_backward", BackwardTerms<T>{x, g, m}, l, device, stream);
  const double* p = need_sums ? partials.data_ptr<double>() : nullptr;

  // Per channel: the parameter gradients, and grad_input = a * g + bx * (x - mu) + k,
  // the training terms folded into bx and k (zero in evaluation).
  const bool need_input = grad_input.defined() && grad_input.numel() > 0;
  Tensor constants = need_input ? empty({4 * l.channels}, TensorOptions(DType::Float64, device)) : Tensor();
  double* k = need_input ? constants.data_ptr<double>() : nullptr;
  const ChannelOut<T> gw(grad_weight), gb(grad_bias);
  const int64_t chunks = l.chunks, channels = l.channels;
  const double count = static_cast<double>(l.per_channel());
  for_each_index("batch_norm_backward", channels, stream, [=] __device__(int64_t c) {
    double sum_g = 0, sum_gd = 0;
    if (p)
      for (int64_t j = 0; j < chunks; ++j) {
        sum_g += p[2 * (c * chunks + j)];
        sum_gd += p[2 * (c * chunks + j) + 1];
      }
    const BatchNormBackwardCoefficients coeffs =
        batch_norm_backward_coefficients(w[c], v[c], eps, sum_g, sum_gd, count, training);
    gb.set(c, sum_g);
    gw.set(c, coeffs.grad_weight);
    if (k == nullptr) return;
    k[c] = coeffs.input.a;
    k[channels + c] = coeffs.input.bx;
    k[2 * channels + c] = coeffs.input.k;
    k[3 * channels + c] = m[c];
  });
  if (!need_input) return;
  T* gi = grad_input.data_ptr<T>();
  for_each_element("batch_norm_backward", l, stream, [=] __device__(int64_t i, int64_t c) {
    const BatchNormInputGrad grad_of{k[c], k[channels + c], k[2 * channels + c]};
    gi[i] = static_cast<T>(grad_of(static_cast<double>(g[i]), static_cast<double>(x[i]) - k[3 * channels + c]));
  });
}

void stats_kernel(const Tensor& input, const Tensor& mean, const Tensor& var, const Tensor& running_mean,
                  const Tensor& running_var, double momentum) {
  DeviceGuard guard(input.device());
  cudaStream_t stream = stream_of(input.device());
  dispatch_floating(input.dtype(), "batch_norm", [&](auto tag) {
    stats_typed<typename decltype(tag)::type>(input, mean, var, running_mean, running_var, momentum, stream);
  });
}

void forward_kernel(const Tensor& input, const Tensor& mean, const Tensor& var, double eps, const Tensor& weight,
                    const Tensor& bias, const Tensor& out) {
  DeviceGuard guard(input.device());
  cudaStream_t stream = stream_of(input.device());
  dispatch_floating(input.dtype(), "batch_norm", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(input, mean, var, eps, weight, bias, out, stream);
  });
}

void backward_kernel(const Tensor& grad_out, const Tensor& input, const Tensor& mean, const Tensor& var, double eps,
                     const Tensor& weight, bool training, const Tensor& grad_input, const Tensor& grad_weight,
                     const Tensor& grad_bias) {
  DeviceGuard guard(input.device());
  cudaStream_t stream = stream_of(input.device());
  dispatch_floating(input.dtype(), "batch_norm backward", [&](auto tag) {
    backward_typed<typename decltype(tag)::type>(grad_out, input, mean, var, eps, weight, training, grad_input,
                                                 grad_weight, grad_bias, stream);
  });
}

}  // namespace

void register_batch_norm_kernels() {
  batch_norm_stats_stub.set(DeviceType::CUDA, &stats_kernel);
  batch_norm_forward_stub.set(DeviceType::CUDA, &forward_kernel);
  batch_norm_backward_stub.set(DeviceType::CUDA, &backward_kernel);
}

}  // namespace weft::cuda
