// safetensors reading and writing.
//
// Loading validates in two passes before any tensor data is read: the JSON header entry by
// entry (fields, dtype, shape, offsets against the real file size), then the layout as a
// whole (sorted by offset, the entries must tile the data buffer exactly). Only then are
// the tensors read, each straight into its own storage with pread. Sizes come from the
// file's length, never from the header alone, so a lying header cannot make us allocate
// or read more than the file holds.
//
// Saving streams one tensor at a time through an AtomicFile (core/atomic_file.h): readers
// see the old file or the new one, never a mix, and a failure removes the temporary.
#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"

namespace weft {

// Tensor bytes are copied as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// A std::map-backed object: ordered_json looks keys up linearly, quadratic in the number of
// tensors. The header is parsed an entry at a time (parse_header), which keeps file order.
using Json = nlohmann::json;

// A header larger than this is corruption, not a checkpoint: real headers are a few
// hundred bytes per tensor, and the JSON is parsed into memory whole.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeCode {
  std::string_view code;
  DType dtype;
};
constexpr DTypeCode kDTypeCodes[] = {
    {"F32", DType::Float32}, {"F64", DType::Float64}, {"I64", DType::Int64}, {"I32", DType::Int32},
    {"U8", DType::UInt8},    {"BOOL", DType::Bool},   {"BF16", DType::BFloat16}, {"F16", DType::Float16},
};

std::string_view code_of(DType dtype) {
  for (const auto& c : kDTypeCodes)
    if (c.dtype == dtype) return c.code;
  WEFT_FAIL("safetensors: dtype ", dtype_name(dtype), " has no safetensors code");
}

std::optional<DType> dtype_of_code(std::string_view code) {
  for (const auto& c : kDTypeCodes)
    if (c.code == code) return c.dtype;
  return std::nullopt;
}

std::string errno_text(int err) { return std::strerror(err); }

// Closes on scope exit; the loader throws from many places.
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// One header entry once its fields have been checked.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// Everything load_safetensors knows about the file it reads, for error messages.
struct Source {
  std::string path;
  uint64_t file_size;
  uint64_t header_size;
  uint64_t data_start() const { return 8 + header_size; }
  uint64_t buffer_size() const { return file_size - data_start(); }

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    WEFT_FAIL("load_safetensors: '", path, "': ", parts...);
  }
};

std::string json_type(const Json& value) {
  if (value.is_number_unsigned()) return "a non-negative integer";
  if (value.is_number_integer()) return "a negative integer";
  if (value.is_number_float()) return "a non-integer number";
  return std::string(value.is_array() || value.is_object() ? "an " : "a ") + value.type_name();
}

// A non-negative integer that fits int64; `what` names it in the error.
uint64_t get_index(const Source& src, const std::string& name, const Json& value, const std::string& what) {
  if (value.is_number_integer() && !value.is_number_unsigned())
    src.fail("tensor '", name, "': ", what, " is ", value.get<int64_t>(), ", negative");
  if (!value.is_number_unsigned()) src.fail("tensor '", name, "': ", what, " is ", json_type(value), ", expected a non-negative integer");
  uint64_t v = value.get<uint64_t>();
  if (v > static_cast<uint64_t>(INT64_MAX)) src.fail("tensor '", name, "': ", what, " is ", v, ", beyond 2^63 - 1");
  return v;
}

Entry parse_entry(const Source& src, const std::string& name, const Json& info) {
  if (!info.is_object()) src.fail("tensor '", name, "': entry is ", json_type(info), ", expected an object");
  for (const auto& field : {"dtype", "shape", "data_offsets"})
    if (!info.contains(field)) src.fail("tensor '", name, "': entry has no '", field, "'");
  for (const auto& [key, value] : info.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      src.fail("tensor '", name, "': unexpected field '", key, "' (expected dtype, shape, data_offsets)");

  Entry e{name, DType::Float32, Shape(), 0, 0};
  const Json& dtype = info["dtype"];
  if (!dtype.is_string()) src.fail("tensor '", name, "': dtype is ", json_type(dtype), ", expected a string");
  auto parsed = dtype_of_code(dtype.get_ref<const std::string&>());
  if (!parsed)
    src.fail("tensor '", name, "': unknown dtype '", dtype.get_ref<const std::string&>(),
             "' (weft reads F32, F64, I64, I32, U8, BOOL, F16, BF16)");
  e.dtype = *parsed;

  const Json& shape = info["shape"];
  if (!shape.is_array()) src.fail("tensor '", name, "': shape is ", json_type(shape), ", expected an array");
  if (shape.size() > static_cast<size_t>(kMaxDims))
    src.fail("tensor '", name, "': shape has ", shape.size(), " dims, weft tensors have at most ", kMaxDims);
  // The product of the non-zero dims must fit too: weft computes strides from them even
  // for an empty tensor.
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    uint64_t n = get_index(src, name, shape[d], "shape[" + std::to_string(d) + "]");
    e.shape.push_back(static_cast<int64_t>(n));
    has_zero |= n == 0;
    if (n != 0 && (__builtin_mul_overflow(nonzero_product, n, &nonzero_product) || nonzero_product > INT64_MAX))
      src.fail("tensor '", name, "': shape ", shape.dump(), " has more elements than fit in 64 bits");
  }
  uint64_t nbytes = 0;
  if (!has_zero && (__builtin_mul_overflow(nonzero_product, static_cast<uint64_t>(element_size(e.dtype)), &nbytes) ||
                    nbytes > INT64_MAX))
    src.fail("tensor '", name, "': shape ", e.shape, " of ", code_of(e.dtype), " overflows a 64-bit byte size");

  const Json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    src.fail("tensor '", name, "': data_offsets is ", json_type(offsets),
             offsets.is_array() ? " of " + std::to_string(offsets.size()) + " values" : "",
             ", expected [begin, end]");
  e.begin = get_index(src, name, offsets[0], "data_offsets[0]");
  e.end = get_index(src, name, offsets[1], "data_offsets[1]");
  if (e.begin > e.end) src.fail("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] has begin > end");
  if (e.end > src.buffer_size())
    src.fail("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] end past the data buffer of ",
             src.buffer_size(), " bytes (file byte ", src.data_start() + e.end, ", file is ", src.file_size,
             " bytes)");
  if (e.end - e.begin != nbytes)
    src.fail("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
             " bytes but shape ", e.shape, " of ", code_of(e.dtype), " needs ", nbytes, " (at file byte ",
             src.data_start() + e.begin, ")");
  return e;
}

std::map<std::string, std::string> parse_metadata(const Source& src, const Json& metadata) {
  if (!metadata.is_object()) src.fail("__metadata__ is ", json_type(metadata), ", expected an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) src.fail("__metadata__ '", key, "' is ", json_type(value), ", expected a string");
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The first pass over the header: syntax, repeated keys and the structure. nlohmann's DOM
// keeps one value of a repeated key silently (a repeated tensor name would hide a tensor);
// this pass names it. Its parse callbacks rescan the parent object at every entry's end,
// quadratic unless, as parse_header does, every entry is dropped once checked.
class HeaderScan : public nlohmann::json_sax<Json> {
 public:
  std::string duplicate;           // the first repeated key, described
  std::string error;               // the syntax error, if any
  size_t error_byte = 0;           // 1-based, as nlohmann counts

  std::string out_of_format;       // a structure no safetensors header has, described

  bool null() override { return count_value(); }
  bool boolean(bool) override { return count_value(); }
  bool number_integer(number_integer_t) override { return count_value(); }
  bool number_unsigned(number_unsigned_t) override { return count_value(); }
  bool number_float(number_float_t, const string_t&) override { return count_value(); }
  bool string(string_t&) override { return count_value(); }
  bool binary(binary_t&) override { return count_value(); }
  bool start_array(std::size_t) override { return open_container(/*object=*/false); }
  bool end_array() override {
    containers_.pop_back();
    return true;
  }
  bool start_object(std::size_t) override { return open_container(/*object=*/true); }
  bool end_object() override {
    containers_.pop_back();
    open_objects_.pop_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!count_value()) return false;
    if (open_objects_.size() == 1) current_entry_ = key;
    if (!open_objects_.back().insert(key).second && duplicate.empty())
      duplicate = open_objects_.size() == 1 ? "the name '" + key + "' appears twice in the header"
                                            : "entry '" + current_entry_ + "' has the key '" + key + "' twice";
    return true;
  }
  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) override {
    // what() starts with "[json.exception.parse_error.101] "; the rest is the useful part.
    std::string_view what = e.what();
    if (auto cut = what.find("] "); cut != std::string_view::npos) what.remove_prefix(cut + 2);
    error = what;
    error_byte = byte;
    return false;
  }

 private:
  // A header is an object of entries, whose fields are strings or short flat arrays (shape,
  // data_offsets). The scan stops at the first value nested deeper, or at a field holding more
  // values than any shape can have, before a DOM of it is built: hostile headers cost nothing
  // to reject, and the DOM of one that passes is small per byte of header.
  static constexpr int kMaxDepth = 3;
  static constexpr size_t kMaxFieldValues = 2 * kMaxDims;

  struct Container {
    bool object;
    size_t values = 0;
  };

  bool open_container(bool object) {
    if (!count_value()) return false;
    if (containers_.empty() && !object) {
      out_of_format = "the header is an array, expected a JSON object";
      return false;
    }
    if (containers_.size() == kMaxDepth) {
      out_of_format = "entry '" + current_entry_ + "' nests values deeper than a safetensors header does";
      return false;
    }
    containers_.push_back({object});
    if (object) open_objects_.emplace_back();
    return true;
  }

  // Counts a value (or an object's key) in the innermost field-level container.
  bool count_value() {
    if (containers_.size() < kMaxDepth) return true;
    Container& c = containers_.back();
    if (++c.values > (c.object ? 2 : 1) * kMaxFieldValues) {
      out_of_format = "entry '" + current_entry_ + "' has a field of more than " + std::to_string(kMaxFieldValues) +
                      " values, more than a shape or data_offsets holds";
      return false;
    }
    return true;
  }

  std::vector<Container> containers_;
  std::vector<std::set<std::string>> open_objects_;
  std::string current_entry_;
};

// The header's entries in file order, and its metadata.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
};

Header parse_header(const Source& src, const std::string& text) {
  HeaderScan scan;
  const bool parsed = Json::sax_parse(text, &scan);
  if (!scan.out_of_format.empty()) src.fail(scan.out_of_format);
  if (!parsed)
    src.fail("the header is not valid JSON (near file byte ", 8 + (scan.error_byte > 0 ? scan.error_byte - 1 : 0),
             "): ", scan.error);
  if (!scan.duplicate.empty()) src.fail(scan.duplicate);
  // Each top-level entry is checked as soon as it is parsed and then dropped from the DOM,
  // which so never holds more than one entry: memory follows the entries, not the text.
  Header header;
  std::string name;
  Json root = Json::parse(text, [&](int depth, Json::parse_event_t event, Json& value) {
    if (depth != 1) return true;
    if (event == Json::parse_event_t::key) {
      name = value.get<std::string>();
      return true;
    }
    // An entry is complete at its object_end (array_end, value: entries of the wrong type).
    if (event != Json::parse_event_t::object_end && event != Json::parse_event_t::array_end &&
        event != Json::parse_event_t::value)
      return true;
    if (name == "__metadata__") header.metadata = parse_metadata(src, value);
    else header.entries.push_back(parse_entry(src, name, value));
    return false;
  });
  if (!root.is_object()) src.fail("the header is ", json_type(root), ", expected a JSON object");
  return header;
}

// Sorted by offset, the entries must cover [0, buffer size) exactly once.
void check_layout(const Source& src, std::vector<Entry>& entries) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      src.fail("tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, "] overlap tensor '", previous->name,
               "' (which ends at buffer byte ", covered, ", file byte ", src.data_start() + covered, ")");
    if (e.begin > covered)
      src.fail("tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, "] leave a hole: buffer bytes ",
               covered, " to ", e.begin, " (file byte ", src.data_start() + covered, ") belong to no tensor");
    covered = e.end;
    previous = &e;
  }
  if (covered != src.buffer_size())
    src.fail("trailing bytes: the tensors end at buffer byte ", covered, " but the file goes on from byte ",
             src.data_start() + covered, " to ", src.file_size);
}

void read_at(const Source& src, int fd, void* dst, uint64_t n, uint64_t at, const std::string& name) {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, out, n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) src.fail("reading ", name, " at file byte ", at, ": ", errno_text(errno));
    if (got == 0) src.fail("the file ended at byte ", at, " while reading ", name, " (was it truncated meanwhile?)");
    out += got;
    at += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}


bool is_valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

// The file's header, checked whole against the file (load_safetensors reads the data after it).
struct CheckedHeader {
  Source src;
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
};

CheckedHeader read_checked_header(const FileDescriptor& file, const std::string& path) {
  WEFT_CHECK(file.fd >= 0, "load_safetensors: cannot open '", path, "': ", errno_text(errno));
  struct stat info {};
  WEFT_CHECK(::fstat(file.fd, &info) == 0, "load_safetensors: cannot stat '", path, "': ", errno_text(errno));
  WEFT_CHECK(S_ISREG(info.st_mode), "load_safetensors: '", path, "' is not a regular file");

  Source src{path, static_cast<uint64_t>(info.st_size), 0};
  if (src.file_size < 8)
    src.fail("the file is ", src.file_size, " bytes long, too short for the 8-byte header length");
  unsigned char length_bytes[8];
  read_at(src, file.fd, length_bytes, 8, 0, "the header length");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  if (header_size > kMaxHeaderBytes)
    src.fail("header length ", header_size, " (bytes 0-7) is larger than the limit of ", kMaxHeaderBytes,
             " bytes: not a safetensors file, or a corrupted one");
  if (header_size > src.file_size - 8)
    src.fail("header length ", header_size, " (bytes 0-7) runs past the end of the file (", src.file_size,
             " bytes, so at most ", src.file_size - 8, " header bytes)");
  src.header_size = header_size;

  std::string text(header_size, '\0');
  read_at(src, file.fd, text.data(), header_size, 8, "the header");
  // nlohmann's lexer takes a NUL for the end of input and would ignore what follows it.
  if (auto nul = text.find('\0'); nul != std::string::npos)
    src.fail("the header holds a NUL byte at file byte ", 8 + nul, " (headers are JSON padded with spaces)");
  Header header = parse_header(src, text);
  CheckedHeader out{src, std::move(header.metadata), std::move(header.entries)};
  check_layout(src, out.entries);
  return out;
}

}  // namespace

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  FileDescriptor file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  return read_checked_header(file, path).metadata;
}

SafetensorsFile load_safetensors(const std::string& path) {
  FileDescriptor file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  auto [src, metadata, entries] = read_checked_header(file, path);
  SafetensorsFile out;
  out.metadata = std::move(metadata);
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    const uint64_t nbytes = e.end - e.begin;
    if (nbytes > 0) read_at(src, file.fd, t.raw_data(), nbytes, src.data_start() + e.begin, "tensor '" + e.name + "'");
    if (e.dtype == DType::Bool) {
      // Any byte but 0 or 1 is not a bool; reading it as one is undefined behaviour.
      const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
      for (uint64_t i = 0; i < nbytes; ++i)
        if (bytes[i] > 1)
          src.fail("tensor '", e.name, "': BOOL element ", i, " is ", int(bytes[i]), " (file byte ",
                   src.data_start() + e.begin + i, "), expected 0 or 1");
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string op = "save_safetensors: '" + path + "': ";
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    WEFT_CHECK(t.defined(), op, "tensor '", name, "' is undefined");
    WEFT_CHECK(name != "__metadata__", op, "'__metadata__' is reserved for the metadata and cannot name a tensor");
    WEFT_CHECK(names.insert(name).second, op, "the name '", name, "' appears twice");
    WEFT_CHECK(is_valid_utf8(name), op, "the tensor name '", name, "' is not valid UTF-8");
  }
  for (const auto& [key, value] : metadata)
    WEFT_CHECK(is_valid_utf8(key) && is_valid_utf8(value), op, "metadata '", key, "' is not valid UTF-8");

  // Largest elements first: the buffer starts at a multiple of 8, so every tensor then
  // starts at a multiple of its element size (what zero-copy readers such as numpy and
  // PyTorch views need).
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].second.element_size() > tensors[b].second.element_size();
  });

  // Written entry by entry, in data order and with the fields in the spec's order (a Json
  // object would sort both).
  std::string text = "{";
  if (!metadata.empty()) text += "\"__metadata__\":" + Json(metadata).dump();
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    const uint64_t nbytes = static_cast<uint64_t>(t.nbytes());
    if (text.size() > 1) text += ',';
    text += Json(name).dump() + ":{\"dtype\":\"" + std::string(code_of(t.dtype())) +
            "\",\"shape\":" + Json(t.shape().vec()).dump() + ",\"data_offsets\":[" + std::to_string(offset) +
            "," + std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  AtomicFile file(path, "save_safetensors");
  file.write(length_bytes, 8);
  file.write(text);
  for (size_t i : order) {
    // One host copy at a time: a checkpoint of GPU or strided tensors never needs a
    // second copy of the whole model.
    Tensor t = tensors[i].second.detach();
    if (!t.device().is_cpu()) t = t.to(kCPU);
    t = t.contiguous();
    if (t.nbytes() > 0) file.write(t.raw_data(), static_cast<size_t>(t.nbytes()));
  }
  file.commit();
}

}  // namespace weft
