// The allocator kind from WEFT_CUDA_ALLOCATOR, and byte counts for messages (see
// device_allocator.h). Plain C++: no CUDA here.
#include "kernels/cuda/device_allocator.h"

#include <cstdio>
#include <string_view>

#include "core/error.h"

namespace weft::cuda {

AllocatorKind allocator_kind(const char* value) {
  const std::string_view text = value == nullptr ? "" : value;
  if (text.empty() || text == "caching") return AllocatorKind::Caching;
  if (text == "direct") return AllocatorKind::Direct;
  WEFT_FAIL("WEFT_CUDA_ALLOCATOR='", text,
            "': expected 'caching' (the default: cached, stream-ordered blocks) or 'direct' (one exact-size "
            "cudaMalloc / cudaFree per block, for compute-sanitizer)");
}

std::string format_bytes(int64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  constexpr double KiB = 1024.0, MiB = KiB * 1024, GiB = MiB * 1024, TiB = GiB * 1024;
  if (b >= TiB) std::snprintf(text, sizeof text, "%.2f TiB", b / TiB);
  else if (b >= GiB) std::snprintf(text, sizeof text, "%.2f GiB", b / GiB);
  else if (b >= MiB) std::snprintf(text, sizeof text, "%.2f MiB", b / MiB);
  else if (b >= KiB) std::snprintf(text, sizeof text, "%.2f KiB", b / KiB);
  else std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(bytes));
  return text;
}

}  // namespace weft::cuda
