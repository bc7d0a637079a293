// CUDA elementwise kernels: binary ops with broadcasting, unary ops, where.
//
// Every op is a small functor with the formula of kernels/cpu/elementwise.cpp, so both
// devices agree bit for bit wherever CUDA's math library rounds as the host's does. One
// launcher runs them all, on one of two paths picked on the host:
//   packets: out and every input contiguous in out's shape (or one element broadcast to
//            all), one dtype, 16-byte aligned. Each thread then moves one 16-byte packet
//            per operand per step (4 floats, 2 doubles, 16 bytes): the widest load a
//            thread can issue, so a warp reads whole 128-byte lines with a quarter of the
//            instructions. The n % lanes tail runs one element per thread.
//   indexed: anything else. The multi-index of each element is computed once for all
//            operands from the merged shape (kernels/operands.h), with 32-bit division
//            when the tensor has fewer than 2^31 elements: 64-bit division is a long
//            software sequence on the GPU. Operands that merged into one run (contiguous
//            but misaligned, a bool output, a broadcast scalar) skip the division.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numbers>
#include <type_traits>
#include <utility>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/elementwise_kernels.h"
#include "kernels/host_device_math.h"

namespace weft::cuda {

namespace {

// --- math: the float or double routine, named explicitly for device code --------------

namespace math {
__device__ __forceinline__ float exp(float x) { return ::expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float log(float x) { return ::logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float tanh(float x) { return ::tanhf(x); }
__device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float erf(float x) { return ::erff(x); }
__device__ __forceinline__ double erf(double x) { return ::erf(x); }
__device__ __forceinline__ float pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
}  // namespace math

// The CPU's constants, computed the same way (the same double, then rounded to T).
constexpr double kSqrtHalf = std::numbers::sqrt2 / 2;
constexpr double kNormalPdfScale = 0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2;

template <class T>
__device__ __forceinline__ T gelu(T x) {
  return T(0.5) * x * (T(1) + math::erf(x * T(kSqrtHalf)));
}

template <class T>
__device__ __forceinline__ T gelu_grad(T x) {
  T cdf = T(0.5) * (T(1) + math::erf(x * T(kSqrtHalf)));
  T pdf = math::exp(T(-0.5) * x * x) * T(kNormalPdfScale);
  return cdf + x * pdf;
}

// GELU's tanh form and its exact derivative, the CPU's formulas (kernels/cpu/elementwise.cpp).
constexpr double kGeluTanhBeta = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;  // sqrt(2 / pi)
constexpr double kGeluTanhKappa = 0.044715;

template <class T>
__device__ __forceinline__ T gelu_tanh(T x) {
  const T inner = T(kGeluTanhBeta) * (x + T(kGeluTanhKappa) * x * x * x);
  return T(0.5) * x * (T(1) + math::tanh(inner));
}

template <class T>
__device__ __forceinline__ T gelu_tanh_grad(T x) {
  const T x2 = x * x;
  const T t = math::tanh(T(kGeluTanhBeta) * (x + T(kGeluTanhKappa) * x2 * x));
  const T inner_grad = T(kGeluTanhBeta) * (T(1) + T(3 * kGeluTanhKappa) * x2);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * inner_grad;
}

template <class T>
__device__ __forceinline__ T sigmoid(T x) {
  // Split by sign so that exp never overflows.
  if (x >= T(0)) return T(1) / (T(1) + math::exp(-x));
  T e = math::exp(x);
  return e / (T(1) + e);
}

// Integer x^y, exact where the CPU's round trip through double pow is (results below
// 2^53), wrapping like the integer type beyond. A negative exponent truncates 1 / x^|y|
// toward zero as the CPU's cast does; 0^negative, undefined there, gives 0 here.
template <class T>
__device__ __forceinline__ T integer_pow(T base, T exponent) {
  if constexpr (std::is_signed_v<T>) {
    if (exponent < 0) {
      if (base == T(1)) return T(1);
      if (base == T(-1)) return (exponent & 1) ? T(-1) : T(1);
      return T(0);
    }
  }
  using U = std::make_unsigned_t<T>;
  U result = 1, factor = static_cast<U>(base);
  for (U e = static_cast<U>(exponent); e != 0; e >>= 1) {
    if (e & 1) result = static_cast<U>(result * factor);
    factor = static_cast<U>(factor * factor);
  }
  return static_cast<T>(result);
}

// --- binary functors: (x, y) -> out -------------------------------------------------

template <class T> struct Add { __device__ T operator()(T x, T y) const { return T(x + y); } };
template <class T> struct Sub { __device__ T operator()(T x, T y) const { return T(x - y); } };
template <class T> struct Mul { __device__ T operator()(T x, T y) const { return T(x * y); } };
// Integers divide with truncation toward zero, and x / 0 and INT_MIN / -1 give the CPU's
// defined results (Note [Integer division by zero]); div() itself takes floats only.
template <class T> struct Div {
  __device__ T operator()(T x, T y) const {
    if constexpr (std::is_integral_v<T>) return hd::int_div(x, y);
    else return T(x / y);
  }
};
template <class T> struct Pow {
  __device__ T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return math::pow(x, y);
    else return integer_pow(x, y);
  }
};
// A NaN in either operand wins (x != x is the NaN test that also compiles for integers).
template <class T> struct Maximum { __device__ T operator()(T x, T y) const { return (x != x || x > y) ? x : y; } };
template <class T> struct Minimum { __device__ T operator()(T x, T y) const { return (x != x || x < y) ? x : y; } };
template <class T> struct Eq { __device__ bool operator()(T x, T y) const { return x == y; } };
template <class T> struct Ne { __device__ bool operator()(T x, T y) const { return x != y; } };
template <class T> struct Lt { __device__ bool operator()(T x, T y) const { return x < y; } };
template <class T> struct Le { __device__ bool operator()(T x, T y) const { return x <= y; } };
template <class T> struct Gt { __device__ bool operator()(T x, T y) const { return x > y; } };
template <class T> struct Ge { __device__ bool operator()(T x, T y) const { return x >= y; } };
template <class T> struct ReluBackward { __device__ T operator()(T g, T y) const { return hd::relu_grad(g, y); } };
template <class T> struct SigmoidBackward {
  __device__ T operator()(T g, T y) const { return T(g * y * (T(1) - y)); }
};
template <class T> struct TanhBackward { __device__ T operator()(T g, T y) const { return T(g * (T(1) - y * y)); } };
template <class T> struct GeluBackward { __device__ T operator()(T g, T x) const { return g * gelu_grad(x); } };
template <class T> struct GeluTanhBackward {
  __device__ T operator()(T g, T x) const { return g * gelu_tanh_grad(x); }
};

// --- unary functors -------------------------------------------------------------------

template <class T> struct Neg { __device__ T operator()(T x) const { return T(-x); } };
// Unsigned types are spelled apart only to keep "x < 0 is always false" out of the build log.
template <class T> struct Abs {
  __device__ T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x;
    else return x < T(0) ? T(-x) : x;
  }
};
// NaN and both zeros give 0.
template <class T> struct Sign {
  __device__ T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return T(x != T(0));
    else return T((T(0) < x) - (x < T(0)));
  }
};
template <class T> struct Relu { __device__ T operator()(T x) const { return hd::relu(x); } };
template <class T> struct Exp { __device__ T operator()(T x) const { return math::exp(x); } };
template <class T> struct Log { __device__ T operator()(T x) const { return math::log(x); } };
template <class T> struct Sqrt { __device__ T operator()(T x) const { return math::sqrt(x); } };
template <class T> struct Sigmoid { __device__ T operator()(T x) const { return sigmoid(x); } };
template <class T> struct Tanh { __device__ T operator()(T x) const { return math::tanh(x); } };
template <class T> struct Gelu { __device__ T operator()(T x) const { return gelu(x); } };
template <class T> struct GeluTanh { __device__ T operator()(T x) const { return gelu_tanh(x); } };
template <class T> struct Affine {
  T scale, shift;  // the CPU's static_cast<T> of p0, p1
  __device__ T operator()(T x) const { return T(scale * x + shift); }
};
template <class T> struct PowScalar {
  T exponent;
  __device__ T operator()(T x) const { return math::pow(x, exponent); }
};
template <class T> struct Clamp {
  double lo, hi;  // a missing bound arrives as -inf / +inf
  __device__ T operator()(T x) const {
    // Compared in double as on the CPU; NaN stays NaN.
    double v = static_cast<double>(x);
    return v != v ? x : static_cast<T>(v < lo ? lo : (v > hi ? hi : v));
  }
};
template <class T> struct Where { __device__ T operator()(bool c, T x, T y) const { return c ? x : y; } };

// --- the packet path --------------------------------------------------------------------

constexpr int kPacketBytes = 16;

template <class T>
constexpr int kLanes = kPacketBytes / static_cast<int>(sizeof(T));

template <class T>
struct alignas(kPacketBytes) Packet {
  T lane[kLanes<T>];
};

template <class T, int NIn>
struct PacketOperands {
  T* out;
  const T* in[NIn];
  bool scalar[NIn];  // a one-element input, read once and broadcast to every lane
};

template <class F, class T, int NIn, size_t... I>
__device__ __forceinline__ T apply(const F& f, const T (&v)[NIn], std::index_sequence<I...>) {
  return f(v[I]...);
}

template <class F, class T, int NIn>
__global__ void packet_kernel(int64_t n, PacketOperands<T, NIn> ops, F f) {
  constexpr int kV = kLanes<T>;
  const auto inputs = std::make_index_sequence<NIn>{};
  T broadcast[NIn];
#pragma unroll
  for (int j = 0; j < NIn; ++j) broadcast[j] = ops.scalar[j] ? ops.in[j][0] : T();
  const int64_t packets = n / kV;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = first; k < packets; k += step) {
    Packet<T> x[NIn];
#pragma unroll
    for (int j = 0; j < NIn; ++j)
      if (!ops.scalar[j]) x[j] = reinterpret_cast<const Packet<T>*>(ops.in[j])[k];
    Packet<T> r;
#pragma unroll
    for (int l = 0; l < kV; ++l) {
      T v[NIn];
#pragma unroll
      for (int j = 0; j < NIn; ++j) v[j] = ops.scalar[j] ? broadcast[j] : x[j].lane[l];
      r.lane[l] = apply(f, v, inputs);
    }
    reinterpret_cast<Packet<T>*>(ops.out)[k] = r;
  }
  // The last n % kV elements, one per thread of the grid's first threads (kV <= 16 is
  // less than a block, and the grid has at least one block).
  const int64_t i = packets * kV + first;
  if (i < n) {
    T v[NIn];
#pragma unroll
    for (int j = 0; j < NIn; ++j) v[j] = ops.scalar[j] ? broadcast[j] : ops.in[j][i];
    ops.out[i] = apply(f, v, inputs);
  }
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kPacketBytes == 0; }

template <size_t NIn>
bool packets_apply(const Tensor& out, const std::array<const Tensor*, NIn>& inputs) {
  if (!out.is_contiguous() || !aligned(out.raw_data())) return false;
  for (const Tensor* t : inputs) {
    if (t->numel() == 1) continue;
    if (t->shape() != out.shape() || !t->is_contiguous() || !aligned(t->raw_data())) return false;
  }
  return true;
}

// --- the indexed path ------------------------------------------------------------------

// Stores f(inputs at i) at out's offset, each operand read as its own type.
template <class F, class R, class... In, size_t... I>
__device__ __forceinline__ void apply_at(const F& f, char* const* data, const int64_t* offset,
                                         std::index_sequence<I...>) {
  *reinterpret_cast<R*>(data[0] + offset[0]) = f(*reinterpret_cast<const In*>(data[I + 1] + offset[I + 1])...);
}

// Index is uint32_t when n < 2^31 (then i + grid stride never wraps), else int64_t.
template <class Index, class F, class R, class... In>
__global__ void indexed_kernel(Index n, StridedIndexer<1 + sizeof...(In)> ix, F f) {
  constexpr int kN = 1 + sizeof...(In);
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t offset[kN];
    if (ix.contiguous) {
#pragma unroll
      for (int k = 0; k < kN; ++k) offset[k] = static_cast<int64_t>(i) * ix.strides[k][0];
    } else {
#pragma unroll
      for (int k = 0; k < kN; ++k) offset[k] = 0;
      Index rest = i;
      for (int d = ix.ndim - 1; d > 0; --d) {
        const Index size = static_cast<Index>(ix.sizes[d]);
        const Index next = rest / size;
        const int64_t idx = static_cast<int64_t>(rest - next * size);
        rest = next;
#pragma unroll
        for (int k = 0; k < kN; ++k) offset[k] += idx * ix.strides[k][d];
      }
#pragma unroll
      for (int k = 0; k < kN; ++k) offset[k] += static_cast<int64_t>(rest) * ix.strides[k][0];
    }
    apply_at<F, R, In...>(f, ix.data, offset, std::index_sequence_for<In...>{});
  }
}

// out = f(inputs...) elementwise, the inputs broadcast to out's shape; out has type R
// and input j type In_j. `op` names the op in a launch failure.
template <class R, class... In, class F>
void launch(const char* op, const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& inputs, const F& f) {
  constexpr int kIn = static_cast<int>(sizeof...(In));
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out.device());
  if constexpr ((std::is_same_v<R, In> && ...)) {
    if (packets_apply(out, inputs)) {
      PacketOperands<R, kIn> ops{};
      ops.out = static_cast<R*>(out.raw_data());
      for (int j = 0; j < kIn; ++j) {
        ops.in[j] = static_cast<const R*>(inputs[j]->raw_data());
        ops.scalar[j] = inputs[j]->numel() == 1;
      }
      const int64_t packets = n / kLanes<R>;
      packet_kernel<F, R, kIn><<<grid_size(std::max<int64_t>(packets, 1)), kBlockSize, 0, stream>>>(n, ops, f);
      WEFT_CUDA_CHECK_LAUNCH(op, stream);
      return;
    }
  }
  std::array<const Tensor*, kIn + 1> operands;
  operands[0] = &out;
  for (int j = 0; j < kIn; ++j) operands[j + 1] = inputs[j];
  const StridedIndexer<kIn + 1> ix = make_indexer<kIn + 1>(out.shape(), operands);
  if (n <= INT32_MAX) {
    indexed_kernel<uint32_t, F, R, In...><<<grid_size(n), kBlockSize, 0, stream>>>(static_cast<uint32_t>(n), ix, f);
  } else {
    indexed_kernel<int64_t, F, R, In...><<<grid_size(n), kBlockSize, 0, stream>>>(n, ix, f);
  }
  WEFT_CUDA_CHECK_LAUNCH(op, stream);
}

// --- dispatch ----------------------------------------------------------------------------

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const std::array<const Tensor*, 2> in{&a, &b};
  if constexpr (!std::is_same_v<T, bool>) {
    switch (op) {
      case BinaryOp::Add: return launch<T, T, T>("add", out, in, Add<T>{});
      case BinaryOp::Sub: return launch<T, T, T>("sub", out, in, Sub<T>{});
      case BinaryOp::Mul: return launch<T, T, T>("mul", out, in, Mul<T>{});
      case BinaryOp::Div: return launch<T, T, T>("div", out, in, Div<T>{});
      case BinaryOp::Pow: return launch<T, T, T>("pow", out, in, Pow<T>{});
      case BinaryOp::Maximum: return launch<T, T, T>("maximum", out, in, Maximum<T>{});
      case BinaryOp::Minimum: return launch<T, T, T>("minimum", out, in, Minimum<T>{});
      case BinaryOp::ReluBackward: return launch<T, T, T>("relu_backward", out, in, ReluBackward<T>{});
      case BinaryOp::SigmoidBackward: return launch<T, T, T>("sigmoid_backward", out, in, SigmoidBackward<T>{});
      case BinaryOp::TanhBackward: return launch<T, T, T>("tanh_backward", out, in, TanhBackward<T>{});
      case BinaryOp::GeluBackward:
        if constexpr (std::is_floating_point_v<T>)
          return launch<T, T, T>("gelu_backward", out, in, GeluBackward<T>{});
        break;
      case BinaryOp::GeluTanhBackward:
        if constexpr (std::is_floating_point_v<T>)
          return launch<T, T, T>("gelu_backward (tanh)", out, in, GeluTanhBackward<T>{});
        break;
      default: break;
    }
  }
  switch (op) {
    case BinaryOp::Eq: return launch<bool, T, T>("eq", out, in, Eq<T>{});
    case BinaryOp::Ne: return launch<bool, T, T>("ne", out, in, Ne<T>{});
    case BinaryOp::Lt: return launch<bool, T, T>("lt", out, in, Lt<T>{});
    case BinaryOp::Le: return launch<bool, T, T>("le", out, in, Le<T>{});
    case BinaryOp::Gt: return launch<bool, T, T>("gt", out, in, Gt<T>{});
    case BinaryOp::Ge: return launch<bool, T, T>("ge", out, in, Ge<T>{});
    default: break;
  }
  WEFT_FAIL("binary op ", static_cast<int>(op), " is not defined for dtype ", a.dtype());
}

void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_dtype(a.dtype(), is_comparison(op) ? DTypeSet::All : DTypeSet::Numeric, "binary op",
                 [&](auto tag) { binary_typed<typename decltype(tag)::type>(op, a, b, out); });
}

template <class T>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out, double p0, double p1) {
  const std::array<const Tensor*, 1> x{&in};
  switch (op) {
    case UnaryOp::Neg: return launch<T, T>("neg", out, x, Neg<T>{});
    case UnaryOp::Abs: return launch<T, T>("abs", out, x, Abs<T>{});
    case UnaryOp::Sign: return launch<T, T>("sign", out, x, Sign<T>{});
    case UnaryOp::Relu: return launch<T, T>("relu", out, x, Relu<T>{});
    case UnaryOp::Affine:
      return launch<T, T>("add/sub/mul/div by a scalar", out, x, Affine<T>{static_cast<T>(p0), static_cast<T>(p1)});
    case UnaryOp::Clamp: return launch<T, T>("clamp", out, x, Clamp<T>{p0, p1});
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case UnaryOp::Exp: return launch<T, T>("exp", out, x, Exp<T>{});
      case UnaryOp::Log: return launch<T, T>("log", out, x, Log<T>{});
      case UnaryOp::Sqrt: return launch<T, T>("sqrt", out, x, Sqrt<T>{});
      case UnaryOp::Sigmoid: return launch<T, T>("sigmoid", out, x, Sigmoid<T>{});
      case UnaryOp::Tanh: return launch<T, T>("tanh", out, x, Tanh<T>{});
      case UnaryOp::Gelu: return launch<T, T>("gelu", out, x, Gelu<T>{});
      case UnaryOp::GeluTanh: return launch<T, T>("gelu (tanh)", out, x, GeluTanh<T>{});
      case UnaryOp::PowScalar: return launch<T, T>("pow by a scalar", out, x, PowScalar<T>{static_cast<T>(p0)});
      default: break;
    }
  }
  WEFT_FAIL("unary op ", static_cast<int>(op), " is not defined for dtype ", in.dtype());
}

void unary_kernel(UnaryOp op, const Tensor& in, const Tensor& out, double p0, double p1) {
  dispatch_dtype(in.dtype(), DTypeSet::Numeric, "unary op",
                 [&](auto tag) { unary_typed<typename decltype(tag)::type>(op, in, out, p0, p1); });
}

template <class T>
void where_typed(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  launch<T, bool, T, T>("where", out, {&cond, &a, &b}, Where<T>{});
}

void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_dtype(out.dtype(), DTypeSet::All, "where",
                 [&](auto tag) { where_typed<typename decltype(tag)::type>(cond, a, b, out); });
}

}  // namespace

void register_elementwise_kernels() {
  binary_stub.set(DeviceType::CUDA, &binary_kernel);
  unary_stub.set(DeviceType::CUDA, &unary_kernel);
  where_stub.set(DeviceType::CUDA, &where_kernel);
}

}  // namespace weft::cuda
