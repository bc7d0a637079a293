// CPU conv2d: im2col + Eigen GEMM per sample and group, parallel over the batch.
//
// Per sample, im2col lays the input out as col [C * kH * kW, OH * OW] (row r = (c, ki,
// kj), column = output position), so that the convolution of group g is one product
// out_g [O/G, L] = weight_g [O/G, K] @ col_g [K, L] with K = C/G * kH * kW. im2col reads
// from a copy of the sample with its zero border written out, so its inner loops have no
// bounds tests. A 1x1 kernel with unit stride and no padding needs no col: the input
// already has that layout. Backward per sample: dcol_g = weight_g^T @ grad_out_g,
// scattered back by col2im; grad_weight_g += grad_out_g @ col_g^T. Every product is
// an Eigen GEMM on maps of raw memory; transposes are column-major maps, never copies.
//
// Threads take whole samples. grad_weight sums over the batch, so the batch is cut into
// a fixed number of chunks (depending on N only, never on the thread count), each chunk
// sums its samples in order into its own partial, and the partials are added in chunk
// order: the same float result for any number of threads. Eigen's own threading is off
// for the same reason (see kernels/cpu/matmul.cpp).
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>

#include <algorithm>
#include <cstring>

#include "kernels/conv_kernels.h"
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
// that adding them up stays cheap next to the products.
constexpr int64_t kMaxChunks = 64;

struct Geometry {
  int64_t n, channels, height, width;
  int64_t out_channels, kh, kw, out_h, out_w;
  int64_t groups, group_channels, group_out;  // C / G and O / G
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t k;  // rows of a group's col: C / G * kH * kW
  int64_t l;  // output positions: OH * OW
  bool direct;  // 1x1, unit stride, no padding: col is the input itself

  Geometry(const Tensor& input, const Tensor& weight, int64_t out_h_, int64_t out_w_, const Conv2dParams& p)
      : n(input.size(0)), channels(input.size(1)), height(input.size(2)), width(input.size(3)),
        out_channels(weight.size(0)), kh(weight.size(2)), kw(weight.size(3)), out_h(out_h_), out_w(out_w_),
        groups(p.groups), group_channels(channels / p.groups), group_out(out_channels / p.groups),
        sh(p.stride[0]), sw(p.stride[1]), ph(p.padding[0]), pw(p.padding[1]), dh(p.dilation[0]), dw(p.dilation[1]),
        k(group_channels * kh * kw), l(out_h_ * out_w_),
        direct(kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0) {}

  int64_t input_numel() const { return channels * height * width; }
  int64_t col_numel() const { return groups * k * l; }
  bool padded() const { return ph > 0 || pw > 0; }
  int64_t padded_h() const { return height + 2 * ph; }
  int64_t padded_w() const { return width + 2 * pw; }
  int64_t padded_numel() const { return padded() ? channels * padded_h() * padded_w() : 0; }
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

// The sample with its zero border written out, so that im2col and col2im never test
// bounds (their rows are short, an image row, and a branch per row costs as much as the
// copy). Returns `input` itself when there is no padding.
template <class T>
const T* pad_input(const Geometry& g, const T* input, T* padded) {
  if (!g.padded()) return input;
  const int64_t hp = g.padded_h(), wp = g.padded_w();
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t ih = 0; ih < hp; ++ih) {
      T* dst = padded + (c * hp + ih) * wp;
      const int64_t h = ih - g.ph;
      if (h < 0 || h >= g.height) {
        for (int64_t iw = 0; iw < wp; ++iw) dst[iw] = T(0);
        continue;
      }
      const T* src = input + (c * g.height + h) * g.width;
      for (int64_t iw = 0; iw < g.pw; ++iw) dst[iw] = T(0);
      copy_row(dst + g.pw, src, g.width);
      for (int64_t iw = g.pw + g.width; iw < wp; ++iw) dst[iw] = T(0);
    }
  }
  return padded;
}

// col[(c, ki, kj), (oh, ow)] = padded[c, oh * sh + ki * dh, ow * sw + kj * dw]. The
// output size formula keeps every read inside the padded plane.
template <class T>
void im2col(const Geometry& g, const T* padded, T* col) {
  const int64_t hp = g.padded_h(), wp = g.padded_w();
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const T* src = padded + (c * hp + ki * g.dh) * wp + kj * g.dw;
        T* dst = col + ((c * g.kh + ki) * g.kw + kj) * g.l;
        for (int64_t oh = 0; oh < g.out_h; ++oh, dst += g.out_w, src += g.sh * wp) {
          if (g.sw == 1)
            copy_row(dst, src, g.out_w);
          else
            for (int64_t ow = 0; ow < g.out_w; ++ow) dst[ow] = src[ow * g.sw];
        }
      }
}

// The adjoint of im2col (then of pad_input): every col entry is added to the input
// element it was read from. grad_input is written, not accumulated; `padded` is scratch
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

template <class T>
void forward_typed(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                   const Conv2dParams& p) {
  const Geometry g(input, weight, out.size(2), out.size(3), p);
  const T* in = static_cast<const T*>(input.raw_data());
  const T* w = static_cast<const T*>(weight.raw_data());
  const T* b = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
  T* y = static_cast<T*>(out.raw_data());

  cpu::parallel_for(0, g.n, g.grain(1), [&](int64_t begin, int64_t end) {
    Buffer<T> col_buffer(g.direct ? 0 : g.col_numel()), pad_buffer(g.padded_numel());
    for (int64_t s = begin; s < end; ++s) {
      const T* x = in + s * g.input_numel();
      const T* col = x;
      if (!g.direct) {
        im2col(g, pad_input(g, x, pad_buffer.data()), col_buffer.data());
        col = col_buffer.data();
      }
      T* ys = y + s * g.out_channels * g.l;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        RowMap<T>(ys + grp * g.group_out * g.l, g.group_out, g.l).noalias() =
            ConstRowMap<T>(w + grp * g.group_out * g.k, g.group_out, g.k) *
            ConstRowMap<T>(col + grp * g.k * g.l, g.k, g.l);
      }
      if (b)
        for (int64_t o = 0; o < g.out_channels; ++o) {
          T* row = ys + o * g.l;
          for (int64_t i = 0; i < g.l; ++i) row[i] += b[o];
        }
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
  const int64_t weight_numel = g.out_channels * g.k;
  // grad_input alone has no cross-sample sum: then every sample is its own chunk.
  const int64_t chunks = grad_weight.defined() ? std::min(g.n, kMaxChunks) : g.n;
  Buffer<T> partials(grad_weight.defined() ? chunks * weight_numel : 0);

  cpu::parallel_for(0, chunks, g.grain(g.n / chunks), [&](int64_t chunk_begin, int64_t chunk_end) {
    const bool need_col = grad_weight.defined() && !g.direct;
    const bool need_dcol = gx && !g.direct;
    Buffer<T> col_buffer(need_col ? g.col_numel() : 0), dcol_buffer(need_dcol ? g.col_numel() : 0);
    Buffer<T> pad_buffer(g.padded_numel());
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      const int64_t first = chunk * g.n / chunks, last = (chunk + 1) * g.n / chunks;
      for (int64_t s = first; s < last; ++s) {
        const T* gys = gy + s * out_numel;
        if (grad_weight.defined()) {
          const T* x = in + s * g.input_numel();
          const T* col = x;
          if (need_col) {
            im2col(g, pad_input(g, x, pad_buffer.data()), col_buffer.data());
            col = col_buffer.data();
          }
          T* partial = partials.data() + chunk * weight_numel;
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            RowMap<T> dw(partial + grp * g.group_out * g.k, g.group_out, g.k);
            ConstRowMap<T> dy(gys + grp * g.group_out * g.l, g.group_out, g.l);
            ConstTransposedMap<T> col_t(col + grp * g.k * g.l, g.l, g.k);
            if (s == first) dw.noalias() = dy * col_t;
            else dw.noalias() += dy * col_t;
          }
        }
        if (gx) {
          T* gxs = gx + s * g.input_numel();
          T* dcol = need_dcol ? dcol_buffer.data() : gxs;
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            RowMap<T>(dcol + grp * g.k * g.l, g.k, g.l).noalias() =
                ConstTransposedMap<T>(w + grp * g.group_out * g.k, g.k, g.group_out) *
                ConstRowMap<T>(gys + grp * g.group_out * g.l, g.group_out, g.l);
          }
          if (need_dcol) col2im(g, dcol, gxs, pad_buffer.data());
        }
      }
    }
  });

  if (grad_weight.defined()) {
    T* gw = static_cast<T*>(grad_weight.raw_data());
    // Every element adds the partials in chunk order; threads take ranges of elements.
    cpu::parallel_for(0, weight_numel, cpu::kGrain / chunks, [&](int64_t begin, int64_t end) {
      std::copy(partials.data() + begin, partials.data() + end, gw + begin);
      for (int64_t c = 1; c < chunks; ++c) {
        const T* partial = partials.data() + c * weight_numel;
        for (int64_t i = begin; i < end; ++i) gw[i] += partial[i];
      }
    });
  }
}

void conv2d_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                    const Conv2dParams& params) {
  dispatch_dtype(input.dtype(), DTypeSet::Floating, "conv2d", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(input, weight, bias, out, params);
  });
}

void conv2d_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& grad_input,
                     const Tensor& grad_weight, const Tensor& grad_bias, const Conv2dParams& params) {
  dispatch_dtype(input.dtype(), DTypeSet::Floating, "conv2d backward", [&](auto tag) {
    backward_typed<typename decltype(tag)::type>(grad_out, input, weight, grad_input, grad_weight, grad_bias,
                                                  params);
  });
}

}  // namespace

DispatchStub<Conv2dForwardFn> conv2d_forward_stub{"conv2d", &conv2d_forward};
DispatchStub<Conv2dBackwardFn> conv2d_backward_stub{"conv2d backward", &conv2d_backward};

}  // namespace weft
