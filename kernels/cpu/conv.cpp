// CPU conv2d: register-blocked direct convolutions (kernels/cpu/direct_conv.h), parallel
// over the batch.
//
// Forward, per sample and group: out_g = direct_conv(weight_g packed tap-major, the
// sample with its zero border written out). A 1x1 kernel with unit stride and no
// padding is a GEMM on the input as it lies: out_g [O/G, L] = weight_g [O/G, C/G] @
// input_g [C/G, L] (Eigen, on maps of raw memory).
//
// Backward, per sample: grad_weight_g += direct_conv_weight_grad(grad_out_g transposed,
// the padded sample). With unit stride the input gradient is itself a convolution — of
// grad_out, padded by dilation * (k - 1) - padding, with the weights flipped and their in
// and out channels swapped — and goes through direct_conv; otherwise (strides) the GEMM
// dcol_g = weight_g^T @ grad_out_g gives one column per output position and col2im adds
// each back to the input element it multiplied.
//
// Threads take whole samples. grad_weight sums over the batch, so the batch is cut into
// a fixed number of chunks (depending on the shapes only, never on the thread count), each
// chunk sums its samples in order into its own partial, and the partials are added in chunk
// order: the same float result for any number of threads. Eigen's own threading is off
// for the same reason (see kernels/cpu/matmul.cpp).
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>

#include <algorithm>
#include <cstring>

#include "kernels/conv_kernels.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/direct_conv.h"
#include "kernels/cpu/parallel.h"

namespace weft {

namespace {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstRowMap = Eigen::Map<const Matrix<T>>;
template <class T>
using RowMap = Eigen::Map<Matrix<T>>;
// A row-major [rows, cols] block read as its transpose.
template <class T>
using ConstTransposedMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>>;
// Scratch memory, aligned by Eigen to its packet size.
template <class T>
using Buffer = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// Samples per thread are chosen so that a thread gets at least this many multiply-adds:
// waking threads costs microseconds, more than a small convolution (gradcheck runs
// thousands of them). The ConvNet's layers are far above it: one sample per thread.
constexpr int64_t kParallelMacs = int64_t(1) << 17;

// At most this many grad_weight partials: enough to keep many cores busy, few enough
// that adding them up stays cheap next to the products. Beyond kMinChunks, at most
// kPartialElements elements in all: each partial is zeroed, written and read back, and a
// deep layer's are large (the ResNet's 64->64 3x3: 37k elements each; 64 of them moved 28 MB
// a backward, a fifth of its time on one core). The chunks are also how the backward's
// samples are shared between threads (grad_input too), hence the floor.
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kMinChunks = 16;
constexpr int64_t kPartialElements = int64_t(1) << 18;

struct Geometry {
  int64_t n, channels, height, width;
  int64_t out_channels, kh, kw, out_h, out_w;
  int64_t groups, group_channels, group_out;  // C / G and O / G
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t k;  // taps of a group, (c, ki, kj): C / G * kH * kW
  int64_t l;  // output positions: OH * OW
  bool pointwise;  // 1x1, unit stride, no padding: the input is already a GEMM operand

  Geometry(const Tensor& input, const Tensor& weight, int64_t out_h_, int64_t out_w_, const Conv2dParams& p)
      : n(input.size(0)), channels(input.size(1)), height(input.size(2)), width(input.size(3)),
        out_channels(weight.size(0)), kh(weight.size(2)), kw(weight.size(3)), out_h(out_h_), out_w(out_w_),
        groups(p.groups), group_channels(channels / p.groups), group_out(out_channels / p.groups),
        sh(p.stride[0]), sw(p.stride[1]), ph(p.padding[0]), pw(p.padding[1]), dh(p.dilation[0]), dw(p.dilation[1]),
        k(group_channels * kh * kw), l(out_h_ * out_w_),
        pointwise(kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0) {}

  int64_t input_numel() const { return channels * height * width; }
  int64_t col_numel() const { return groups * k * l; }
  bool padded() const { return ph > 0 || pw > 0; }
  int64_t padded_h() const { return height + 2 * ph; }
  int64_t padded_w() const { return width + 2 * pw; }
  int64_t padded_numel() const { return padded() ? channels * padded_h() * padded_w() : 0; }
  // One group's forward as direct_conv reads it.
  cpu::DirectConvShape forward_shape() const {
    return {group_channels, padded_h(), padded_w(), group_out, kh, kw, sh, sw, dh, dw, out_h, out_w};
  }
  // With unit stride, grad_input is the convolution of grad_out, padded by
  // dilation * (k - 1) - padding, with the flipped weights (in and out channels swapped);
  // it needs that padding to be non-negative.
  bool input_grad_is_conv() const { return sh == 1 && sw == 1 && ph <= dh * (kh - 1) && pw <= dw * (kw - 1); }
  int64_t grad_ph() const { return dh * (kh - 1) - ph; }
  int64_t grad_pw() const { return dw * (kw - 1) - pw; }
  int64_t padded_grad_h() const { return out_h + 2 * grad_ph(); }
  int64_t padded_grad_w() const { return out_w + 2 * grad_pw(); }
  cpu::DirectConvShape input_grad_shape() const {
    return {group_out, padded_grad_h(), padded_grad_w(), group_channels, kh, kw, 1, 1, dh, dw, height, width};
  }
  // Grain for parallel_for over units of `samples` samples each.
  int64_t grain(int64_t samples) const {
    const int64_t macs = std::max<int64_t>(1, samples * out_channels * k * l);
    return std::max<int64_t>(1, (kParallelMacs + macs - 1) / macs);
  }
};

// Image rows are short (14 or 28 elements in a small ConvNet), and the compiler's
// element loops spent most of their time in their scalar remainder. These move fixed
// packets of 32 bytes (one AVX register) instead: copy_row's last packet overlaps the one
// before it (src and dst never overlap), add_row ends with a half packet. Every element
// still gets the same additions in the same order, so results are unchanged.
template <class T>
constexpr int64_t kPacket = 32 / sizeof(T);

template <class T>
void copy_row(T* dst, const T* src, int64_t n) {
  constexpr int64_t p = kPacket<T>;
  if (n < p) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    return;
  }
  for (int64_t i = 0; i + p < n; i += p) std::memcpy(dst + i, src + i, p * sizeof(T));
  std::memcpy(dst + n - p, src + n - p, p * sizeof(T));
}

template <class T>
void add_row(T* dst, const T* src, int64_t n) {
  constexpr int64_t p = kPacket<T>;
  int64_t i = 0;
  for (; i + p <= n; i += p)
    for (int64_t j = 0; j < p; ++j) dst[i + j] += src[i + j];
  if (i + p / 2 <= n) {
    for (int64_t j = 0; j < p / 2; ++j) dst[i + j] += src[i + j];
    i += p / 2;
  }
  for (; i < n; ++i) dst[i] += src[i];
}

// `planes` planes of [h, w] as the convolutions read them: with a zero border of ph rows
// and pw columns written out around each (into `padded`), so that they never test bounds
// (their rows are short, an image row, and a branch per row costs as much as the copy).
// Without a border that is `src` itself.
template <class T>
const T* pad_planes(const T* src, int64_t planes, int64_t h, int64_t w, int64_t ph, int64_t pw, T* padded) {
  if (ph == 0 && pw == 0) return src;
  const int64_t hp = h + 2 * ph, wp = w + 2 * pw;
  // The borders by one fill of the whole buffer (a fill per border of a short row cost as
  // much as the row's copy), then the rows.
  std::memset(padded, 0, static_cast<size_t>(planes * hp * wp) * sizeof(T));
  for (int64_t c = 0; c < planes; ++c)
    for (int64_t row = 0; row < h; ++row) copy_row(padded + (c * hp + row + ph) * wp + pw, src + (c * h + row) * w, w);
  return padded;
}

// The sample as the convolutions read it (`padded` holds padded_numel() elements).
template <class T>
const T* pad_input(const Geometry& g, const T* input, T* padded) {
  return pad_planes(input, g.channels, g.height, g.width, g.ph, g.pw, padded);
}

// col [C * kH * kW, OH * OW] holds, at row (c, ki, kj) and column (oh, ow), a term for
// padded[c, oh * sh + ki * dh, ow * sw + kj * dw]; col2im adds each to that element, then
// drops the border. grad_input is written, not accumulated; `padded` is scratch
// of padded_numel() elements.
template <class T>
void col2im(const Geometry& g, const T* col, T* grad_input, T* padded) {
  const int64_t hp = g.padded_h(), wp = g.padded_w();
  T* acc = g.padded() ? padded : grad_input;
  std::fill(acc, acc + g.channels * hp * wp, T(0));
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* dst = acc + (c * hp + ki * g.dh) * wp + kj * g.dw;
        const T* src = col + ((c * g.kh + ki) * g.kw + kj) * g.l;
        for (int64_t oh = 0; oh < g.out_h; ++oh, src += g.out_w, dst += g.sh * wp) {
          if (g.sw == 1)
            add_row(dst, src, g.out_w);
          else
            for (int64_t ow = 0; ow < g.out_w; ++ow) dst[ow * g.sw] += src[ow];
        }
      }
  if (!g.padded()) return;
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t h = 0; h < g.height; ++h) {
      const T* src = padded + (c * hp + h + g.ph) * wp + g.pw;
      copy_row(grad_input + (c * g.height + h) * g.width, src, g.width);
    }
}

// planes [channels][positions] into out [positions][width] (width >= channels), a run of
// positions at a time: the rows of `out` that a run writes stay in the L1 cache while every
// channel fills its column. Column by column over a whole plane, a 28x28 plane's rows (50 KB
// at 16 channels) left the cache between one channel and the next.
template <class T>
void transpose_planes(const T* planes, int64_t channels, int64_t positions, int64_t width, T* out) {
  constexpr int64_t kRun = 16;
  for (int64_t i0 = 0; i0 < positions; i0 += kRun) {
    const int64_t i1 = std::min(positions, i0 + kRun);
    for (int64_t o = 0; o < channels; ++o) {
      const T* row = planes + o * positions;
      for (int64_t i = i0; i < i1; ++i) out[i * width + o] = row[i];
    }
  }
}

// weight [O, C / G, kH, kW] packed for direct_conv, group after group:
// packed[g][r][o] = weight[g * O / G + o][r] for the taps r = (c, ki, kj).
template <class T>
Buffer<T> pack_forward_weight(const Geometry& g, const T* weight) {
  const int64_t width = cpu::packed_width<T>(g.group_out);
  Buffer<T> packed = Buffer<T>::Zero(g.groups * g.k * width);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t o = 0; o < g.group_out; ++o)
      for (int64_t r = 0; r < g.k; ++r)
        packed[(grp * g.k + r) * width + o] = weight[(grp * g.group_out + o) * g.k + r];
  return packed;
}

// The weights of grad_input as a convolution of grad_out: taps (o, ki, kj) over the
// group's output channels, outputs the group's input channels, the kernel flipped:
// packed[g][(o, ki, kj)][c] = weight[g * O / G + o][c][kH - 1 - ki][kW - 1 - kj].
template <class T>
Buffer<T> pack_input_grad_weight(const Geometry& g, const T* weight) {
  const int64_t width = cpu::packed_width<T>(g.group_channels);
  const int64_t taps = g.group_out * g.kh * g.kw;
  Buffer<T> packed = Buffer<T>::Zero(g.groups * taps * width);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t o = 0; o < g.group_out; ++o)
      for (int64_t c = 0; c < g.group_channels; ++c)
        for (int64_t ki = 0; ki < g.kh; ++ki)
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t tap = (o * g.kh + ki) * g.kw + kj;
            const int64_t from = (((grp * g.group_out + o) * g.group_channels + c) * g.kh + (g.kh - 1 - ki)) * g.kw +
                                 (g.kw - 1 - kj);
            packed[(grp * taps + tap) * width + c] = weight[from];
          }
  return packed;
}

// bias [O] padded per group to direct_conv's row length.
template <class T>
Buffer<T> pack_bias(const Geometry& g, const T* bias) {
  const int64_t width = cpu::packed_width<T>(g.group_out);
  Buffer<T> packed = Buffer<T>::Zero(g.groups * width);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t o = 0; o < g.group_out; ++o) packed[grp * width + o] = bias[grp * g.group_out + o];
  return packed;
}

// out_g = weight_g @ input_g per group, for the pointwise case.
template <class T>
void pointwise_forward(const Geometry& g, const T* x, const T* w, const T* b, T* ys) {
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    RowMap<T>(ys + grp * g.group_out * g.l, g.group_out, g.l).noalias() =
        ConstRowMap<T>(w + grp * g.group_out * g.k, g.group_out, g.k) *
        ConstRowMap<T>(x + grp * g.k * g.l, g.k, g.l);
  }
  if (b)
    for (int64_t o = 0; o < g.out_channels; ++o) {
      T* row = ys + o * g.l;
      for (int64_t i = 0; i < g.l; ++i) row[i] += b[o];
    }
}

template <class T>
void forward_typed(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                   const Conv2dParams& p) {
  const Geometry g(input, weight, out.size(2), out.size(3), p);
  const T* in = static_cast<const T*>(input.raw_data());
  const T* w = static_cast<const T*>(weight.raw_data());
  const T* b = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
  T* y = static_cast<T*>(out.raw_data());

  const cpu::DirectConvShape shape = g.forward_shape();
  const int64_t width = cpu::packed_width<T>(g.group_out);
  const Buffer<T> packed = g.pointwise ? Buffer<T>() : pack_forward_weight(g, w);
  const Buffer<T> packed_bias = b && !g.pointwise ? pack_bias(g, b) : Buffer<T>();
  const int64_t group_plane = g.group_channels * g.padded_h() * g.padded_w();

  cpu::parallel_for(0, g.n, g.grain(1), [&](int64_t begin, int64_t end) {
    Buffer<T> pad_buffer(g.padded_numel());
    for (int64_t s = begin; s < end; ++s) {
      const T* x = in + s * g.input_numel();
      T* ys = y + s * g.out_channels * g.l;
      if (g.pointwise) {
        pointwise_forward(g, x, w, b, ys);
        continue;
      }
      const T* xp = pad_input(g, x, pad_buffer.data());
      for (int64_t grp = 0; grp < g.groups; ++grp)
        cpu::direct_conv(shape, packed.data() + grp * g.k * width, b ? packed_bias.data() + grp * width : nullptr,
                         xp + grp * group_plane, ys + grp * g.group_out * g.l);
    }
  });
}

template <class T>
void backward_typed(const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& grad_input,
                    const Tensor& grad_weight, const Tensor& grad_bias, const Conv2dParams& p) {
  const Geometry g(input, weight, grad_out.size(2), grad_out.size(3), p);
  const T* in = static_cast<const T*>(input.raw_data());
  const T* w = static_cast<const T*>(weight.raw_data());
  const T* gy = static_cast<const T*>(grad_out.raw_data());
  const int64_t out_numel = g.out_channels * g.l;

  if (grad_bias.defined()) {
    // One channel per task: a (vectorised) sum per sample, the samples added in order
    // in float64.
    T* gb = static_cast<T*>(grad_bias.raw_data());
    const int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(1, g.n * g.l));
    cpu::parallel_for(0, g.out_channels, grain, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        double acc = 0;
        for (int64_t s = 0; s < g.n; ++s) acc += Eigen::Map<const Buffer<T>>(gy + s * out_numel + o * g.l, g.l).sum();
        gb[o] = static_cast<T>(acc);
      }
    });
  }
  if (!grad_input.defined() && !grad_weight.defined()) return;

  T* gx = grad_input.defined() ? static_cast<T*>(grad_input.raw_data()) : nullptr;
  // grad_input: a direct convolution of grad_out where the stride allows, else col2im.
  const bool input_grad_by_conv = gx && !g.pointwise && g.input_grad_is_conv();
  const cpu::DirectConvShape grad_shape = g.input_grad_shape();
  const int64_t grad_width = cpu::packed_width<T>(g.group_channels);
  const Buffer<T> grad_packed = input_grad_by_conv ? pack_input_grad_weight(g, w) : Buffer<T>();
  const int64_t grad_group_plane = g.group_out * g.padded_grad_h() * g.padded_grad_w();

  // grad_weight: a partial per chunk, packed tap-major as the forward's weights are.
  const cpu::DirectConvShape shape = g.forward_shape();
  const int64_t width = cpu::packed_width<T>(g.group_out);
  const int64_t packed_numel = g.groups * g.k * width;
  const int64_t group_plane = g.group_channels * g.padded_h() * g.padded_w();
  // grad_input alone has no cross-sample sum: then every sample is its own chunk.
  const int64_t chunks =
      grad_weight.defined() ? std::min({g.n, kMaxChunks, std::max(kMinChunks, kPartialElements / packed_numel)}) : g.n;
  Buffer<T> partials(grad_weight.defined() ? chunks * packed_numel : 0);  // zeroed by their chunk's thread

  cpu::parallel_for(0, chunks, g.grain(g.n / chunks), [&](int64_t chunk_begin, int64_t chunk_end) {
    const bool need_dcol = gx && !g.pointwise && !input_grad_by_conv;
    Buffer<T> dcol_buffer(need_dcol ? g.col_numel() : 0), pad_buffer(g.padded_numel());
    Buffer<T> grad_pad_buffer(input_grad_by_conv ? g.groups * grad_group_plane : 0);
    // One group's grad_out transposed to [position][channel]; the channels beyond the
    // group's stay zero.
    Buffer<T> grad_out_t = Buffer<T>::Zero(grad_weight.defined() ? g.l * width : 0);
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      const int64_t first = chunk * g.n / chunks, last = (chunk + 1) * g.n / chunks;
      T* partial = grad_weight.defined() ? partials.data() + chunk * packed_numel : nullptr;
      if (partial) std::fill(partial, partial + packed_numel, T(0));
      for (int64_t s = first; s < last; ++s) {
        const T* gys = gy + s * out_numel;
        if (grad_weight.defined()) {
          const T* xp = pad_input(g, in + s * g.input_numel(), pad_buffer.data());
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            transpose_planes(gys + grp * g.group_out * g.l, g.group_out, g.l, width, grad_out_t.data());
            cpu::direct_conv_weight_grad(shape, grad_out_t.data(), xp + grp * group_plane, partial + grp * g.k * width);
          }
        }
        if (!gx) continue;
        T* gxs = gx + s * g.input_numel();
        if (input_grad_by_conv) {
          const T* padded =
              pad_planes(gys, g.out_channels, g.out_h, g.out_w, g.grad_ph(), g.grad_pw(), grad_pad_buffer.data());
          for (int64_t grp = 0; grp < g.groups; ++grp)
            cpu::direct_conv(grad_shape, grad_packed.data() + grp * g.group_out * g.kh * g.kw * grad_width,
                             static_cast<const T*>(nullptr), padded + grp * grad_group_plane,
                             gxs + grp * g.group_channels * g.height * g.width);
          continue;
        }
        T* dcol = need_dcol ? dcol_buffer.data() : gxs;
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          RowMap<T>(dcol + grp * g.k * g.l, g.k, g.l).noalias() =
              ConstTransposedMap<T>(w + grp * g.group_out * g.k, g.k, g.group_out) *
              ConstRowMap<T>(gys + grp * g.group_out * g.l, g.group_out, g.l);
        }
        if (need_dcol) col2im(g, dcol, gxs, pad_buffer.data());
      }
    }
  });

  if (grad_weight.defined()) {
    T* gw = static_cast<T*>(grad_weight.raw_data());
    // Every element adds the partials in chunk order; threads take ranges of packed rows
    // (one tap of one group), which are then unpacked into grad_weight.
    const int64_t rows = g.groups * g.k;
    cpu::parallel_for(0, rows, std::max<int64_t>(1, cpu::kGrain / (chunks * width)), [&](int64_t begin, int64_t end) {
      Buffer<T> sum(width);
      for (int64_t row = begin; row < end; ++row) {
        sum = Eigen::Map<const Buffer<T>>(partials.data() + row * width, width);
        for (int64_t c = 1; c < chunks; ++c)
          sum += Eigen::Map<const Buffer<T>>(partials.data() + c * packed_numel + row * width, width);
        const int64_t grp = row / g.k, tap = row % g.k;
        for (int64_t o = 0; o < g.group_out; ++o) gw[(grp * g.group_out + o) * g.k + tap] = sum[o];
      }
    });
  }
}

void conv2d_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                    const Conv2dParams& params) {
  dispatch_floating(input.dtype(), "conv2d", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(input, weight, bias, out, params);
  });
}

void conv2d_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& grad_input,
                     const Tensor& grad_weight, const Tensor& grad_bias, const Conv2dParams& params) {
  dispatch_floating(input.dtype(), "conv2d backward", [&](auto tag) {
    backward_typed<typename decltype(tag)::type>(grad_out, input, weight, grad_input, grad_weight, grad_bias,
                                                  params);
  });
}

}  // namespace

void cpu::register_conv_kernels() {
  conv2d_forward_stub.set(DeviceType::CPU, &conv2d_forward);
  conv2d_backward_stub.set(DeviceType::CPU, &conv2d_backward);
}

}  // namespace weft
