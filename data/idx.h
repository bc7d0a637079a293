// IDX files (the MNIST / Fashion-MNIST format), plain or gzip'd.
//
// An IDX file is a 4-byte magic (0, 0, type code, number of dims), the dims as
// big-endian uint32, then the values, big-endian, row-major. The reader checks every
// part against the file's actual length before trusting it: a bad magic, an unknown type,
// a dim count of 0 or more than 8, or a length that is not exactly header + values is an
// error naming the file and the byte offset.
#pragma once

#include <string>

#include "core/tensor.h"

namespace weft {

// Type codes: 0x08 -> uint8, 0x0C -> int32, 0x0D -> float32, 0x0E -> float64.
// A path ending in ".gz" is decompressed first.
Tensor read_idx(const std::string& path);

// Parses IDX bytes already in memory; `name` appears in error messages.
Tensor parse_idx(const std::string& bytes, const std::string& name);

}  // namespace weft
