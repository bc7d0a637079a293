// A gzip'd IDX file: read_idx inflates it (never past what its header allows) and parses it,
// or throws weft::Error.
#include "core/error.h"
#include "data/idx.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::write_scratch_file("input.gz", data, size);
  try {
    weft::read_idx(path);
  } catch (const weft::Error&) {
  }
  return 0;
}
