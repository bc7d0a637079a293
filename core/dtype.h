// DType: the element types a tensor can hold, and the compile-time dispatch over them.
//
// bfloat16 and float16 are for storage and communication (core/half.h): tensors of them
// can be created, copied, converted, printed, saved and communicated, but an op asked to
// compute with them fails clearly.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/half.h"

namespace weft {

enum class DType : int8_t { Float32, Float64, Int64, Int32, UInt8, Bool, BFloat16, Float16 };
// How many there are (the enum's values are 0 .. kNumDTypes - 1): keep it after the last.
constexpr int kNumDTypes = static_cast<int>(DType::Float16) + 1;

std::string_view dtype_name(DType dtype);
std::ostream& operator<<(std::ostream& out, DType dtype);

constexpr int64_t element_size(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64: return 8;
    case DType::Float32:
    case DType::Int32: return 4;
    case DType::BFloat16:
    case DType::Float16: return 2;
    case DType::UInt8:
    case DType::Bool: return 1;
  }
  return 0;
}

// The dtypes that ops compute in.
constexpr bool is_floating(DType d) { return d == DType::Float32 || d == DType::Float64; }
// float16 and bfloat16: stored and communicated, never computed with.
constexpr bool is_half_precision(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

// Throws "<op>: dtype bfloat16 cannot be computed with ..." for the half-precision types.
void check_supported(DType dtype, const char* op);

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::Float16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <class T> inline constexpr DType dtype_of = DTypeOf<T>::value;

// Dispatch: f is called with a TypeTag<T>; `using T = typename decltype(tag)::type;`.
// A tag (not a templated lambda) keeps the same code usable from CUDA files (C++17).
template <class T> struct TypeTag { using type = T; };

// Floating: float32, float64. Numeric: and the integers. All: and bool (every dtype that
// ops compute in; dispatch_storage_dtype adds the half-precision types).
enum class DTypeSet { Floating, Numeric, All };

template <class F>
decltype(auto) dispatch_dtype(DType dtype, DTypeSet allowed, const char* op, F&& f) {
  switch (dtype) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: break;
  }
  if (allowed != DTypeSet::Floating) {
    switch (dtype) {
      case DType::Int64: return f(TypeTag<int64_t>{});
      case DType::Int32: return f(TypeTag<int32_t>{});
      case DType::UInt8: return f(TypeTag<uint8_t>{});
      default: break;
    }
  }
  if (allowed == DTypeSet::All && dtype == DType::Bool) return f(TypeTag<bool>{});
  check_supported(dtype, op);
  WEFT_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported (expected ",
            allowed == DTypeSet::Floating ? "float32 or float64" : "a numeric dtype", ")");
}

// Every dtype, Half and BFloat16 included: for the kernels that only move or convert
// values (copy, fill), whose code compiles for the 16-bit types (through hd::convert).
template <class F>
decltype(auto) dispatch_storage_dtype(DType dtype, const char* op, F&& f) {
  if (dtype == DType::Float16) return f(TypeTag<Half>{});
  if (dtype == DType::BFloat16) return f(TypeTag<BFloat16>{});
  return dispatch_dtype(dtype, DTypeSet::All, op, std::forward<F>(f));
}

// Float32 and float64 only, and only those two are instantiated: for kernels whose
// code does not compile for integers. Any other dtype is an error naming `op`.
template <class F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  if (dtype == DType::Float64) return f(TypeTag<double>{});
  if (dtype != DType::Float32) [[unlikely]] {
    check_supported(dtype, op);
    WEFT_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported (expected float32 or float64)");
  }
  return f(TypeTag<float>{});
}

}  // namespace weft
