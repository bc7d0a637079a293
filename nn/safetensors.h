// Checkpoints in the safetensors format (the one Hugging Face's safetensors and PyTorch use).
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// padded with spaces so that the data starts at a multiple of 8, then the data buffer:
// every tensor's bytes, row-major, little-endian, back to back (no holes, no overlap).
//
// The file is untrusted input: load_safetensors checks the whole header against the
// file's real size before it reads a byte of data, and every error names the file, the
// tensor and what is wrong. save_safetensors writes a temporary file beside `path` and
// renames it over `path`, so a crash or a full disk never leaves a half-written checkpoint.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

// In namespace weft, beside read_idx: a file format, not a layer. The tensor list has the
// type of nn::NamedTensors, so a state_dict() goes in as it is.
namespace weft {

// What a file holds: its tensors in the order of their data offsets, and its metadata.
struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes `tensors` (any device or layout; written from a contiguous CPU copy) and
// `metadata`. Names must be unique, valid UTF-8 and not "__metadata__". Tensors are laid
// out by element size, largest first (stably, so same-size tensors keep their order), as
// Python's safetensors does: every tensor then starts at a multiple of its element size.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a file into CPU tensors. Dtypes F32, F64, I64, I32, U8, BOOL, F16 and BF16 load as
// weft's (the 16-bit ones as storage: convert with .to(DType::Float32) to compute; weft
// never converts silently).
SafetensorsFile load_safetensors(const std::string& path);

// The metadata alone, after the same checks of the whole header (no tensor data is read).
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace weft
