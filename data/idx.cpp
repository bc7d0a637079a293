// IDX reading: the whole file into memory (Fashion-MNIST is 30 MB unpacked), then a
// validated parse.
#include "data/idx.h"

#include <zlib.h>

#include <cstring>
#include <optional>
#include <fstream>
#include <sstream>

namespace weft {

namespace {

std::string read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in.good(), "read_idx: cannot open '", path, "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

uint32_t big_endian_u32(const std::string& bytes, size_t at) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

DType dtype_of_code(int code, const std::string& name) {
  switch (code) {
    case 0x08: return DType::UInt8;
    case 0x0C: return DType::Int32;
    case 0x0D: return DType::Float32;
    case 0x0E: return DType::Float64;
    default: break;
  }
  WEFT_FAIL("read_idx: '", name, "': unsupported type code 0x", std::hex, code, std::dec,
            " at byte 2 (supported: 0x08 uint8, 0x0C int32, 0x0D float32, 0x0E float64)");
}

// What an IDX header says: the dtype, the shape, and so the file's exact size.
struct IdxHeader {
  DType dtype;
  Shape shape;
  size_t header_bytes;
  uint64_t count;        // values
  uint64_t total_bytes;  // header + values
};

// The header at the start of `bytes`, which must hold all of it. Sizes are multiplied with
// a cap checked before each product (so a product never wraps around), and the dims that
// are not zero are capped too (a zero beside huge dims would hide them from the count).
IdxHeader parse_header(const std::string& bytes, const std::string& name) {
  WEFT_CHECK(bytes.size() >= 4, "read_idx: '", name, "' is ", bytes.size(), " bytes long, too short for an IDX header");
  WEFT_CHECK(bytes[0] == 0 && bytes[1] == 0, "read_idx: '", name,
             "' does not start with an IDX magic number (bytes 0-1 must be zero)");
  IdxHeader h;
  h.dtype = dtype_of_code(static_cast<unsigned char>(bytes[2]), name);
  const int ndim = static_cast<unsigned char>(bytes[3]);
  WEFT_CHECK(ndim >= 1 && ndim <= kMaxDims, "read_idx: '", name, "': ", ndim, " dimensions at byte 3 (expected 1 to ",
             kMaxDims, ")");
  h.header_bytes = 4 + 4 * static_cast<size_t>(ndim);
  WEFT_CHECK(bytes.size() >= h.header_bytes, "read_idx: '", name, "' is truncated in its header: ", bytes.size(),
             " bytes, the header of ", ndim, " dims needs ", h.header_bytes);
  constexpr uint64_t kCap = uint64_t{1} << 40;
  uint64_t count = 1, nonzero = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint32_t n = big_endian_u32(bytes, 4 + 4 * d);
    h.shape.push_back(n);
    if (n == 0) {
      count = 0;
      continue;
    }
    WEFT_CHECK(nonzero <= kCap / n, "read_idx: '", name, "': dims up to byte ", 8 + 4 * d,
               " describe more than 2^40 values");
    nonzero *= n;
    count *= n;
  }
  h.count = count;
  h.total_bytes = h.header_bytes + count * element_size(h.dtype);
  return h;
}

// The gzip'd file inflated, but never past what its header describes: a small file that
// inflates to gigabytes (a gzip bomb) stops one byte after the size its header allows.
std::string read_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  WEFT_CHECK(file != nullptr, "read_idx: cannot open '", path, "'");
  std::string out;
  std::optional<uint64_t> limit;  // the header's total, once the header is in
  char chunk[1 << 16];
  int n = 0;
  try {
    while ((n = gzread(file, chunk, sizeof chunk)) > 0) {
      out.append(chunk, static_cast<size_t>(n));
      if (!limit && out.size() >= 4 && out.size() >= 4 + 4 * static_cast<size_t>(static_cast<unsigned char>(out[3])))
        limit = parse_header(out, path).total_bytes;
      WEFT_CHECK(!limit || out.size() <= *limit, "read_idx: '", path, "' inflates to more than the ", *limit,
                 " bytes its header describes (stopped after ", out.size(), " bytes)");
    }
  } catch (...) {
    gzclose(file);
    throw;
  }
  // A truncated stream ends in a "successful" read of 0 bytes with an error recorded.
  int status = Z_OK;
  std::string why = gzerror(file, &status);
  gzclose(file);
  WEFT_CHECK(n == 0 && (status == Z_OK || status == Z_STREAM_END), "read_idx: '", path,
             "' is not a valid gzip file (", why, ") after ", out.size(), " decompressed bytes");
  return out;
}

}  // namespace

Tensor parse_idx(const std::string& bytes, const std::string& name) {
  const IdxHeader h = parse_header(bytes, name);
  const DType dtype = h.dtype;
  const uint64_t count = h.count, expected = h.total_bytes;
  const size_t header = h.header_bytes;
  const Shape& shape = h.shape;
  WEFT_CHECK(bytes.size() == expected, "read_idx: '", name, "' has ", bytes.size(), " bytes but its header (shape ",
             shape, ", ", dtype, ") needs exactly ", expected, bytes.size() < expected ? " (truncated at byte " : " (",
             bytes.size() < expected ? std::to_string(bytes.size()) : "trailing bytes from " + std::to_string(expected),
             ")");
  Tensor out = empty(shape, dtype);
  const int64_t width = element_size(dtype);
  auto* dst = static_cast<unsigned char*>(out.raw_data());
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data()) + header;
  if (width == 1) {
    if (count > 0) std::memcpy(dst, src, count);  // an empty tensor has no buffer: memcpy's null is UB
  } else {
    // Values are big-endian; the host is little-endian (x86-64, arm64).
    for (uint64_t i = 0; i < count; ++i)
      for (int64_t b = 0; b < width; ++b) dst[i * width + b] = src[i * width + (width - 1 - b)];
  }
  return out;
}

Tensor read_idx(const std::string& path) {
  bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  return parse_idx(gz ? read_gzip(path) : read_plain(path), path);
}

}  // namespace weft
