// Direct convolution on the CPU, register-blocked: conv2d's forward, its input gradient
// (the same kernel on grad_out with flipped weights) and its weight gradient, used by
// kernels/cpu/conv.cpp.
//
// direct_conv: out[o, oh, ow] = bias[o] + sum over taps r = (c, ki, kj) of
//              packed[r][o] * input[c, oh * sh + ki * dh, ow * sw + kj * dw]
//
// for one sample and one group, reading an input whose zero border is already written
// out (so no tap tests bounds). The weights arrive packed tap-major, [taps][width] with
// the output channels padded with zeros to whole vectors, so that one vector load gives
// the weight of one tap for `kLanes` output channels. A block of the output — OV vectors
// of channels by PB consecutive positions of one row — is held in OV * PB vector
// registers for the whole sum over taps: per tap, OV weight loads and PB scalar input
// loads (each broadcast) feed OV * PB fused multiply-adds. Nothing goes through an im2col
// buffer. For the ConvNet's second layer (400 taps, 32 channels) the forward took 3.8 ms
// per batch of 128 on two cores, im2col + Eigen GEMM 5.7 ms; its input gradient 4.6 ms,
// GEMM + col2im 8.3 ms.
//
// direct_conv_weight_grad turns the same blocking around: OV vectors of channels by TB
// taps stay in registers while the sum runs over the output positions.
//
// Every output element is its own sum, in a fixed order: the result depends neither on
// the block sizes nor on the number of threads.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace weft::cpu {

// The widest vector the build targets, as a GCC / Clang vector extension: the compiler
// emits the AVX-512 (or AVX, or SSE) instructions, and the code stays plain C++.
#if defined(__AVX512F__)
constexpr int64_t kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int64_t kVectorBytes = 32;
#else
constexpr int64_t kVectorBytes = 16;
#endif

template <class T>
struct VectorOf;
template <>
struct VectorOf<float> {
  typedef float type __attribute__((vector_size(kVectorBytes)));
};
template <>
struct VectorOf<double> {
  typedef double type __attribute__((vector_size(kVectorBytes)));
};
template <class T>
using Vector = typename VectorOf<T>::type;
template <class T>
constexpr int64_t kLanes = kVectorBytes / static_cast<int64_t>(sizeof(T));

// Accumulators per block: 14 of AVX-512's 32 vector registers, 12 of AVX's or SSE's 16,
// leaving room for two vectors of weights and the broadcast input.
constexpr int kMaxAccumulators = kVectorBytes == 64 ? 14 : 12;

struct DirectConvShape {
  int64_t in_channels;   // of one group
  int64_t in_h, in_w;    // of the input as read: padding included
  int64_t out_channels;  // of one group
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t out_h, out_w;

  int64_t taps() const { return in_channels * kh * kw; }
};

// Vectors of output channels per block: two when there are more channels than lanes.
template <class T>
int channel_vectors(int64_t out_channels) {
  return out_channels > kLanes<T> ? 2 : 1;
}

// Row length of the packed weights (and of the packed bias): the output channels
// rounded up to whole blocks.
template <class T>
int64_t packed_width(int64_t out_channels) {
  const int64_t block = channel_vectors<T>(out_channels) * kLanes<T>;
  return (out_channels + block - 1) / block * block;
}

namespace direct_conv_detail {

template <class T>
Vector<T> load(const T* p) {
  Vector<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Where each tap (c, ki, kj) reads, relative to a position's corner: one offset per tap,
// so that the blocks walk the taps in one loop. Nested loops over c, ki and kj gave a 3x3
// kernel's innermost loop three turns, and the loops around it cost about as much as its
// body: the one loop took the ResNet's 16->16 forward from 4.2 to 2.9 ms and its training
// step from 79 to 63 ms, one thread (bench/conv_layers, bench/ddp_overhead). The weight
// gradient's blocks keep their two loops over the output positions: one loop with a table
// of corners measured slower there.
inline void tap_offsets(const DirectConvShape& s, int64_t* offsets) {
  for (int64_t c = 0, t = 0; c < s.in_channels; ++c)
    for (int64_t ki = 0; ki < s.kh; ++ki)
      for (int64_t kj = 0; kj < s.kw; ++kj) offsets[t++] = (c * s.in_h + ki * s.dh) * s.in_w + kj * s.dw;
}

// One block: output channels [o0, o0 + OV * kLanes) (those below out_channels are
// stored) at positions (oh, ow .. ow + PB - 1).
template <class T, int OV, int PB>
void block(const DirectConvShape& s, const int64_t* offsets, const T* packed, int64_t width, const T* bias,
           const T* input, T* out, int64_t o0, int64_t oh, int64_t ow) {
  constexpr int64_t lanes = kLanes<T>;
  Vector<T> acc[OV][PB];
  for (int v = 0; v < OV; ++v) {
    const Vector<T> init = bias ? load(bias + o0 + v * lanes) : Vector<T>{};
    for (int p = 0; p < PB; ++p) acc[v][p] = init;
  }
  const T* corner = input + oh * s.sh * s.in_w + ow * s.sw;
  const T* weights = packed + o0;
  const int64_t taps = s.taps();
  for (int64_t t = 0; t < taps; ++t, weights += width) {
    Vector<T> w[OV];
    for (int v = 0; v < OV; ++v) w[v] = load(weights + v * lanes);
    const T* x = corner + offsets[t];
    for (int p = 0; p < PB; ++p) {
      const T xp = x[p * s.sw];
      for (int v = 0; v < OV; ++v) acc[v][p] += w[v] * xp;
    }
  }
  const int64_t positions = s.out_h * s.out_w;
  T* dst = out + oh * s.out_w + ow;
  for (int v = 0; v < OV; ++v)
    for (int64_t lane = 0; lane < lanes; ++lane) {
      const int64_t o = o0 + v * lanes + lane;
      if (o >= s.out_channels) return;
      for (int p = 0; p < PB; ++p) dst[o * positions + p] = acc[v][p][lane];
    }
}

template <class T>
using BlockFn = void (*)(const DirectConvShape&, const int64_t*, const T*, int64_t, const T*, const T*, T*, int64_t,
                         int64_t, int64_t);

// blocks<T, OV>()[pb]: the block of pb positions, pb in [1, kMaxAccumulators / OV].
template <class T, int OV, size_t... I>
constexpr std::array<BlockFn<T>, sizeof...(I) + 1> make_blocks(std::index_sequence<I...>) {
  return {nullptr, &block<T, OV, static_cast<int>(I) + 1>...};
}

template <class T, int OV>
const auto& blocks() {
  static constexpr auto table = make_blocks<T, OV>(std::make_index_sequence<kMaxAccumulators / OV>());
  return table;
}

// The weight gradient's block: output channels [o0, o0 + OV * kLanes) of TB taps from
// t0, summed over every output position and added to packed_grad.
template <class T, int OV, int TB>
void weight_grad_block(const DirectConvShape& s, const int64_t* offsets, const T* grad_out_t, int64_t width,
                       const T* input, T* packed_grad, int64_t o0, int64_t t0) {
  constexpr int64_t lanes = kLanes<T>;
  int64_t offset[TB];  // where each tap reads, relative to the position's corner
  for (int t = 0; t < TB; ++t) offset[t] = offsets[t0 + t];
  Vector<T> acc[OV][TB];
  for (int t = 0; t < TB; ++t)
    for (int v = 0; v < OV; ++v) acc[v][t] = load(packed_grad + (t0 + t) * width + o0 + v * lanes);
  const T* grad = grad_out_t + o0;
  for (int64_t oh = 0; oh < s.out_h; ++oh)
    for (int64_t ow = 0; ow < s.out_w; ++ow, grad += width) {
      const T* x = input + oh * s.sh * s.in_w + ow * s.sw;
      Vector<T> g[OV];
      for (int v = 0; v < OV; ++v) g[v] = load(grad + v * lanes);
      for (int t = 0; t < TB; ++t) {
        const T xt = x[offset[t]];
        for (int v = 0; v < OV; ++v) acc[v][t] += g[v] * xt;
      }
    }
  for (int t = 0; t < TB; ++t)
    for (int v = 0; v < OV; ++v)
      std::memcpy(packed_grad + (t0 + t) * width + o0 + v * lanes, &acc[v][t], sizeof(acc[v][t]));
}

template <class T>
using WeightGradBlockFn = void (*)(const DirectConvShape&, const int64_t*, const T*, int64_t, const T*, T*, int64_t,
                                   int64_t);

template <class T, int OV, size_t... I>
constexpr std::array<WeightGradBlockFn<T>, sizeof...(I) + 1> make_weight_grad_blocks(std::index_sequence<I...>) {
  return {nullptr, &weight_grad_block<T, OV, static_cast<int>(I) + 1>...};
}

template <class T, int OV>
const auto& weight_grad_blocks() {
  static constexpr auto table = make_weight_grad_blocks<T, OV>(std::make_index_sequence<kMaxAccumulators / OV>());
  return table;
}

// [0, n) cut into as few pieces of at most `most` as possible, of nearly equal length.
template <class F>
void for_each_piece(int64_t n, int64_t most, const F& f) {
  const int64_t pieces = (n + most - 1) / most;
  for (int64_t p = 0; p < pieces; ++p) f(p * n / pieces, (p + 1) * n / pieces);
}

}  // namespace direct_conv_detail

// The whole [out_channels, out_h, out_w] output of one sample and group. `packed` is
// [taps][packed_width], `bias` (nullable) is [packed_width]; both zero beyond
// out_channels. Output rows are cut into as few blocks as fit the registers, of nearly
// equal length (a row of 14 with two channel vectors: two blocks of 7).
template <class T>
void direct_conv(const DirectConvShape& s, const T* packed, const T* bias, const T* input, T* out) {
  using namespace direct_conv_detail;
  const int ov = channel_vectors<T>(s.out_channels);
  const int64_t width = packed_width<T>(s.out_channels);
  std::vector<int64_t> offsets(static_cast<size_t>(s.taps()));
  tap_offsets(s, offsets.data());
  for (int64_t o0 = 0; o0 < s.out_channels; o0 += ov * kLanes<T>)
    for (int64_t oh = 0; oh < s.out_h; ++oh)
      for_each_piece(s.out_w, kMaxAccumulators / ov, [&](int64_t begin, int64_t end) {
        const auto fn = ov == 1 ? blocks<T, 1>()[end - begin] : blocks<T, 2>()[end - begin];
        fn(s, offsets.data(), packed, width, bias, input, out, o0, oh, begin);
      });
}

// Adds one sample's weight gradient to packed_grad [taps][packed_width] (tap-major, as
// the forward's weights are packed): packed_grad[r][o] += sum over output positions of
// grad_out_t[position][o] * input[the tap's element for that position]. grad_out_t is
// the sample's grad_out transposed, [out_h * out_w][packed_width], zero beyond
// out_channels. Blocks hold OV vectors of channels by up to kMaxAccumulators / OV taps
// in registers across all positions: per position, OV loads of grad_out and one
// broadcast input load per tap.
template <class T>
void direct_conv_weight_grad(const DirectConvShape& s, const T* grad_out_t, const T* input, T* packed_grad) {
  using namespace direct_conv_detail;
  const int ov = channel_vectors<T>(s.out_channels);
  const int64_t width = packed_width<T>(s.out_channels);
  std::vector<int64_t> offsets(static_cast<size_t>(s.taps()));
  tap_offsets(s, offsets.data());
  for (int64_t o0 = 0; o0 < s.out_channels; o0 += ov * kLanes<T>)
    for_each_piece(s.taps(), kMaxAccumulators / ov, [&](int64_t begin, int64_t end) {
      const auto fn = ov == 1 ? weight_grad_blocks<T, 1>()[end - begin] : weight_grad_blocks<T, 2>()[end - begin];
      fn(s, offsets.data(), grad_out_t, width, input, packed_grad, o0, begin);
    });
}

}  // namespace weft::cpu
