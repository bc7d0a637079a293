// IDX bytes in memory: parse_idx either returns a tensor whose size matches its header or
// throws weft::Error; anything else (a crash, another exception, a sanitizer report) is a bug.
#include <string>

#include "core/error.h"
#include "data/idx.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    weft::Tensor t = weft::parse_idx(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    if (t.numel() > static_cast<int64_t>(size)) __builtin_trap();  // more values than bytes read
  } catch (const weft::Error&) {
  }
  return 0;
}
