// DType names.
#include "core/dtype.h"

#include <ostream>

namespace weft {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

void check_supported(DType dtype, const char* op) {
  WEFT_CHECK(!is_half_precision(dtype), op, ": dtype ", dtype_name(dtype),
             " cannot be computed with (weft stores and communicates 16-bit floats, but computes in float32 or "
             "float64): convert with .to(DType::Float32) first");
}

}  // namespace weft
