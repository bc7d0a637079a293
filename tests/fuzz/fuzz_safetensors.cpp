// A safetensors file: load_safetensors loads it whole or throws weft::Error, and a file it
// loads saves and loads again to the same tensors.
#include <cstring>

#include "core/error.h"
#include "fuzz_target.h"
#include "nn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::write_scratch_file("input.safetensors", data, size);
  weft::SafetensorsFile file;
  try {
    file = weft::load_safetensors(path);
  } catch (const weft::Error&) {
    return 0;
  }
  const std::string again = path + ".again";
  weft::save_safetensors(again, file.tensors, file.metadata);
  weft::SafetensorsFile reloaded = weft::load_safetensors(again);
  if (reloaded.tensors.size() != file.tensors.size() || reloaded.metadata != file.metadata) __builtin_trap();
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const weft::Tensor& a = file.tensors[i].second;
    const weft::Tensor& b = reloaded.tensors[i].second;
    if (a.dtype() != b.dtype() || a.shape() != b.shape() ||
        (a.nbytes() > 0 && std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.nbytes())) != 0))
      __builtin_trap();
  }
  return 0;
}
