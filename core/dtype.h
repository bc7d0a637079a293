// DType: the element types a tensor can hold, and the compile-time dispatch over them.
//
// bfloat16 and float16 are reserved for mixed precision: they exist in the enum so that
// files and APIs can name them, but any op asked to compute with them fails clearly.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace weft {

enum class DType : int8_t { Float32, Float64, Int64, Int32, UInt8, Bool, BFloat16, Float16 };

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

constexpr bool is_floating(DType d) { return d == DType::Float32 || d == DType::Float64; }
constexpr bool is_reserved(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

// Throws "<op>: dtype bfloat16 is not supported yet" for the reserved types.
void check_supported(DType dtype, const char* op);

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };
template <class T> inline constexpr DType dtype_of = DTypeOf<T>::value;

// Dispatch: f is called with a TypeTag<T>; `using T = typename decltype(tag)::type;`.
// A tag (not a templated lambda) keeps the same code usable from CUDA files (C++17).
template <class T> struct TypeTag { using type = T; };

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
