// safetensors checkpoints: round trips of every dtype and layout, the exact bytes of the
// format, atomic writes, and one hand-crafted malformed file per validation rule. The two
// "interop" cases are skipped here; safetensors_interop.py runs them with
// --no-skip, around Python's safetensors.
#include "test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "nn/module.h"
#include "nn/safetensors.h"

using namespace weft;
namespace fs = std::filesystem;

// Evaluates `text` once; the failure shows both strings.
#define CHECK_CONTAINS(text, part)                                                               \
  do {                                                                                            \
    const std::string text_ = (text), part_ = (part);                                             \
    CHECK_MESSAGE(text_.find(part_) != std::string::npos, "\"", text_, "\" lacks \"", part_, "\""); \
  } while (0)

namespace {

// doctest::Contains takes a C string; most expected texts here are built from paths.
doctest::Contains contains(const std::string& text) { return doctest::Contains(text.c_str()); }

// A fresh directory per test case, removed with everything in it.
struct ScratchDir {
  fs::path dir;
  explicit ScratchDir(const std::string& name)
      : dir(fs::temp_directory_path() / ("weft_test_safetensors_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~ScratchDir() { fs::remove_all(dir); }
  std::string path(const std::string& file) const { return (dir / file).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    return out;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file from a JSON header (not padded unless the test pads it) and a data buffer.
std::string file_of(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

// The bytes of a tensor in row-major order: the exact comparison for a round trip.
std::string bytes_of(const Tensor& t) {
  Tensor host = t.detach().to(kCPU).contiguous();
  return std::string(static_cast<const char*>(host.raw_data()), static_cast<size_t>(host.nbytes()));
}

// Eight F32 bytes: 1.0f and 2.0f.
const std::string kTwoFloats("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);

// The values both sides of the interop test write and check (safetensors_interop.py has
// the same table).
nn::NamedTensors interop_tensors() {
  std::vector<float> f32(12);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) f32[c * 3 + r] = (r * 4 + c) * 0.25f - 1.5f;  // stored transposed
  std::vector<double> f64(6);
  for (int i = 0; i < 6; ++i) f64[i] = 1.0 / (i + 1);
  return {
      {"f32", tensor(f32, {4, 3}).t()},  // a non-contiguous [3, 4] view
      {"f64", tensor(f64, {2, 3})},
      {"i64", tensor(std::vector<int64_t>{-1099511627776, 0, 1099511627783, std::numeric_limits<int64_t>::max()})},
      {"i32", tensor(std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -1, 0, 2147483647})},
      {"u8", tensor(std::vector<uint8_t>{0, 1, 127, 128, 255})},
      {"bool", tensor(std::vector<int64_t>{1, 0, 0, 1}, {2, 2}).to(DType::Bool)},
      {"scalar", scalar_tensor(3.5, DType::Float32)},
      {"empty", empty({0, 3}, DType::Float32)},
      // float16's largest value, a subnormal, and 1/3 rounded: numpy's float16 has the same bits.
      {"f16", tensor(std::vector<double>{-65504, 0x1p-24, 1.0 / 3, 0.1}).to(DType::Float16)},
  };
}

// What a loaded file must hold, whoever wrote it.
void check_interop_tensors(const SafetensorsFile& file) {
  nn::NamedTensors expected = interop_tensors();
  REQUIRE(file.tensors.size() == expected.size());
  // Named elements, not structured bindings: find_if's and doctest's lambdas capture name, and Clang 14
  // cannot capture those.
  for (const auto& named : expected) {
    const std::string& name = named.first;
    const Tensor& want = named.second;
    auto it = std::find_if(file.tensors.begin(), file.tensors.end(), [&](const auto& e) { return e.first == name; });
    REQUIRE_MESSAGE(it != file.tensors.end(), "missing tensor ", name);
    CAPTURE(name);
    CHECK(it->second.dtype() == want.dtype());
    CHECK(it->second.shape() == want.shape());
    CHECK(bytes_of(it->second) == bytes_of(want));
  }
}

}  // namespace

TEST_CASE("every dtype, 0-d, empty and non-contiguous tensors round trip exactly") {
  ScratchDir scratch("roundtrip");
  Tensor cpu1 = test::random({3, 2}, DType::Float32, 7).to(Device("cpu:1"));
  nn::NamedTensors saved = {
      {"f32", test::random({3, 5}, DType::Float32, 1)},
      {"f64.noncontiguous", test::noncontiguous(test::random({2, 3, 4}, DType::Float64, 2))},
      {"i64", tensor(std::vector<int64_t>{-(int64_t{1} << 53) - 1, -1, 0, 42, std::numeric_limits<int64_t>::max()})},
      {"i32", test::random({7}, DType::Float64, 3, -1e9, 1e9).to(DType::Int32)},
      {"u8", test::noncontiguous(test::random({9}, DType::Float64, 4, 0, 255).to(DType::UInt8))},
      {"bool", gt(test::random({2, 3}, DType::Float64, 5), 0.0)},
      {"scalar", scalar_tensor(-2.25, DType::Float64)},
      {"empty.f32", empty({0, 4}, DType::Float32)},
      {"empty.i64", empty({2, 0}, DType::Int64)},
      {"leaf", test::leaf({2, 2}, 6)},
      {"cpu1", cpu1},
      {"expanded", test::random({1, 3}, DType::Float32, 8).expand({4, 3})},
      {"f16", test::random({2, 3}, DType::Float64, 9).to(DType::Float16)},
      {"bf16.noncontiguous", test::noncontiguous(test::random({3, 2}, DType::Float64, 10).to(DType::BFloat16))},
  };
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"epoch", "3"}, {"note", "ünïcode, \"quoted\""}};
  const std::string path = scratch.path("all.safetensors");
  save_safetensors(path, saved, metadata);
  SafetensorsFile loaded = load_safetensors(path);

  CHECK(loaded.metadata == metadata);
  // Data order: 8-byte elements, then 4-byte, 2-byte and 1-byte, each group in the order given.
  std::vector<std::string> names;
  for (const auto& [name, t] : loaded.tensors) names.push_back(name);
  CHECK(names == std::vector<std::string>{"f64.noncontiguous", "i64", "scalar", "empty.i64", "leaf", "f32", "i32",
                                          "empty.f32", "cpu1", "expanded", "f16", "bf16.noncontiguous", "u8",
                                          "bool"});
  for (const auto& named : saved) {
    const std::string& name = named.first;
    const Tensor& want = named.second;
    CAPTURE(name);
    auto it = std::find_if(loaded.tensors.begin(), loaded.tensors.end(), [&](const auto& e) { return e.first == name; });
    REQUIRE(it != loaded.tensors.end());
    const Tensor& got = it->second;
    CHECK(got.device() == kCPU);
    CHECK(got.is_contiguous());
    CHECK_FALSE(got.requires_grad());
    CHECK(got.dtype() == want.dtype());
    CHECK(got.shape() == want.shape());
    CHECK(bytes_of(got) == bytes_of(want));
  }
}

TEST_CASE("no tensors and no metadata is a valid file") {
  ScratchDir scratch("nothing");
  save_safetensors(scratch.path("e.safetensors"), {});
  CHECK(read_bytes(scratch.path("e.safetensors")) == le64(8) + "{}      ");
  SafetensorsFile loaded = load_safetensors(scratch.path("e.safetensors"));
  CHECK(loaded.tensors.empty());
  CHECK(loaded.metadata.empty());
}

TEST_CASE("the bytes on disk follow the spec: length, space-padded JSON, aligned data") {
  ScratchDir scratch("bytes");
  const std::string path = scratch.path("a.safetensors");
  save_safetensors(path, {{"a", tensor({1.0f, 2.0f})}});
  const std::string json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";  // 54 bytes
  CHECK(read_bytes(path) == le64(56) + json + "  " + kTwoFloats);

  // Mixed element sizes: the header stays a multiple of 8 and every tensor starts at a
  // multiple of its own element size.
  save_safetensors(path, {{"u8", tensor(std::vector<uint8_t>{1, 2, 3})},
                          {"f32", tensor({1.0f})},
                          {"i64", tensor(std::vector<int64_t>{5})}},
                   {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 8 + 4 + 3);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find(R"("__metadata__":{"k":"v"})") != std::string::npos);
  CHECK(header.find(R"("i64":{"dtype":"I64","shape":[1],"data_offsets":[0,8]})") != std::string::npos);
  CHECK(header.find(R"("f32":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})") != std::string::npos);
  CHECK(header.find(R"("u8":{"dtype":"U8","shape":[3],"data_offsets":[12,15]})") != std::string::npos);
  CHECK(header.find_last_not_of(' ') == header.find_last_of('}'));
  CHECK(bytes.substr(8 + n) == std::string("\x05\0\0\0\0\0\0\0\x00\x00\x80\x3f\x01\x02\x03", 15));
}

TEST_CASE("files padded by other writers, unpadded headers and any key order load") {
  ScratchDir scratch("padding");
  const std::string path = scratch.path("p.safetensors");
  // No padding at all, data at file byte 8 + 54; keys inside the entry in another order.
  write_bytes(path, file_of(R"({"a":{"shape":[2],"data_offsets":[0,8],"dtype":"F32"}})", kTwoFloats));
  CHECK(load_safetensors(path).tensors.at(0).second.to_vector<float>() == std::vector<float>{1, 2});
  // Whitespace inside the JSON, and tensors listed out of offset order.
  write_bytes(path, file_of("  {\n \"b\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [8, 9]},\n"
                            " \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]} }   ",
                            kTwoFloats + "\x07"));
  SafetensorsFile loaded = load_safetensors(path);
  REQUIRE(loaded.tensors.size() == 2);
  CHECK(loaded.tensors[0].first == "a");
  CHECK(loaded.tensors[1].first == "b");
  CHECK(loaded.tensors[1].second.to_vector<uint8_t>() == std::vector<uint8_t>{7});
}

TEST_CASE("saving is atomic: no temporary is left, and failures remove it") {
  ScratchDir scratch("atomic");
  const std::string path = scratch.path("model.safetensors");
  save_safetensors(path, {{"w", tensor({1.0f, 2.0f})}});
  save_safetensors(path, {{"w", tensor({3.0f})}});  // replaces the file
  CHECK(scratch.files() == std::vector<std::string>{"model.safetensors"});
  CHECK(load_safetensors(path).tensors.at(0).second.to_vector<float>() == std::vector<float>{3});

  // The target is a directory: nothing is written, the directory stays.
  const std::string dir_target = scratch.path("taken");
  fs::create_directory(dir_target);
  CHECK_THROWS_WITH_AS(save_safetensors(dir_target, {{"w", tensor({1.0f})}}),
                       contains("save_safetensors: cannot write '" + dir_target + "': it is a directory"), Error);
  auto files = scratch.files();
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{"model.safetensors", "taken"});
  CHECK(fs::is_empty(dir_target));

  // A directory that cannot hold the file (root ignores permission bits, so use one that
  // does not exist, and a "directory" that is a regular file).
  const std::string missing = scratch.path("no/such/dir/m.safetensors");
  CHECK_THROWS_WITH_AS(save_safetensors(missing, {{"w", tensor({1.0f})}}),
                       contains("cannot write '" + missing + "' (creating '" + missing + ".tmp." +
                                std::to_string(::getpid()) + "'): No such file or directory"),
                       Error);
  const std::string under_file = path + "/m.safetensors";
  CHECK_THROWS_WITH_AS(save_safetensors(under_file, {{"w", tensor({1.0f})}}),
                       contains("cannot write '" + under_file + "' (creating '" + under_file + ".tmp." +
                                std::to_string(::getpid()) + "'): Not a directory"),
                       Error);
  CHECK(load_safetensors(path).tensors.size() == 1);  // the old file is untouched
}

TEST_CASE("save rejects what the format cannot hold") {
  ScratchDir scratch("save_errors");
  const std::string path = scratch.path("s.safetensors");
  Tensor t = tensor({1.0f});
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"a", t}, {"a", t}}), contains("'" + path + "': the name 'a' appears twice"),
                       Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"__metadata__", t}}), contains("'__metadata__' is reserved"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"a", Tensor()}}), contains("tensor 'a' is undefined"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"bad\xff", t}}), contains("is not valid UTF-8"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"a", t}}, {{"k", "\xc3"}}), contains("metadata 'k' is not valid UTF-8"),
                       Error);
  CHECK(scratch.files().empty());
}

// --- malformed files: one case per rule, each error names the file and what is wrong ---

namespace {

// Writes `bytes` to a file, loads it, and returns the error text ("" when it loaded).
struct Malformed {
  ScratchDir scratch{"malformed"};
  std::string path = scratch.path("bad.safetensors");
  std::string error(const std::string& bytes) {
    // A new file rather than a truncated one: ext4 flushes a file truncated and rewritten
    // (auto_da_alloc), which makes the byte sweep below 100 times slower.
    fs::remove(path);
    write_bytes(path, bytes);
    try {
      load_safetensors(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // The error for a header with one F32 [2] entry "w" whose fields are given.
  std::string entry_error(const std::string& fields, const std::string& data = kTwoFloats) {
    return error(file_of(R"({"w":{)" + fields + "}}", data));
  }
  std::string prefix() const { return "load_safetensors: '" + path + "': "; }
};

const std::string kGoodFields = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";

}  // namespace

TEST_CASE("malformed: missing files and files too short for the header length") {
  Malformed m;
  CHECK_THROWS_WITH_AS(load_safetensors(m.scratch.path("absent")),
                       contains("cannot open '" + m.scratch.path("absent") + "': No such file or directory"), Error);
  CHECK_THROWS_WITH_AS(load_safetensors(m.scratch.dir.string()), contains("is not a regular file"), Error);
  CHECK_CONTAINS(m.error(""), m.prefix() + "the file is 0 bytes long, too short for the 8-byte header length");
  CHECK_CONTAINS(m.error(std::string("\x02\0\0\0\0\0\0", 7)), "the file is 7 bytes long");
}

TEST_CASE("malformed: a header length larger than the file, or absurdly large") {
  Malformed m;
  CHECK_CONTAINS(m.error(le64(100) + "{}"),
             m.prefix() + "header length 100 (bytes 0-7) runs past the end of the file (10 bytes");
  CHECK_CONTAINS(m.error(le64(uint64_t{1} << 62) + "{}"),
             "header length 4611686018427387904 (bytes 0-7) is larger than the limit of 100000000 bytes");
  CHECK_CONTAINS(m.error(le64(~uint64_t{0})), "is larger than the limit");
}

TEST_CASE("malformed: invalid JSON and a header that is not an object") {
  Malformed m;
  CHECK_CONTAINS(m.error(file_of(R"({"w": {"dtype": "F32",)", "")),
             m.prefix() + "the header is not valid JSON (near file byte");
  CHECK_CONTAINS(m.error(file_of(R"({"w" 1})", "")), "syntax error");
  CHECK_CONTAINS(m.error(file_of(std::string("{}\0\0", 4), "")), m.prefix() + "the header holds a NUL byte at file byte 10");
  CHECK_CONTAINS(m.error(file_of("{\"\xff\":1}", "")), "not valid JSON");  // not UTF-8
  CHECK_CONTAINS(m.error(file_of("", "")), "not valid JSON");
  CHECK_CONTAINS(m.error(file_of("[]", "")), m.prefix() + "the header is an array, expected a JSON object");
  CHECK_CONTAINS(m.error(file_of("42", "")), "the header is a non-negative integer, expected a JSON object");
  // Deep nesting is an error, never a stack overflow: the scan stops at the first value
  // nested deeper than a header's fields, before a DOM is built.
  CHECK_CONTAINS(m.error(file_of(std::string(100000, '['), "")), "the header is an array");
  CHECK_CONTAINS(m.error(file_of(R"({"w":{"shape":)" + std::string(100000, '['), "")),
                 m.prefix() + "entry 'w' nests values deeper than a safetensors header does");
  CHECK_CONTAINS(m.error(file_of(R"({"w":{"data_offsets":{"a":{}}}})", "")), "entry 'w' nests values deeper");
  // So does a field longer than any shape: a huge header of it costs nothing to reject.
  std::string long_shape = R"({"w":{"dtype":"F32","shape":[1)";
  for (int i = 0; i < 1000000; ++i) long_shape += ",1";
  CHECK_CONTAINS(m.error(file_of(long_shape + R"(],"data_offsets":[0,4]}})", "")),
                 "entry 'w' has a field of more than 16 values, more than a shape or data_offsets holds");
}

TEST_CASE("malformed: entries with missing fields, wrong types or extra fields") {
  Malformed m;
  CHECK_CONTAINS(m.error(file_of(R"({"w":[1,2]})", "")), m.prefix() + "tensor 'w': entry is an array, expected an object");
  CHECK_CONTAINS(m.entry_error(R"("shape":[2],"data_offsets":[0,8])"), m.prefix() + "tensor 'w': entry has no 'dtype'");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","data_offsets":[0,8])"), "tensor 'w': entry has no 'shape'");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2])"), "tensor 'w': entry has no 'data_offsets'");
  CHECK_CONTAINS(m.entry_error(kGoodFields + R"(,"extra":1)"), "tensor 'w': unexpected field 'extra'");
  CHECK_CONTAINS(m.entry_error(R"("dtype":4,"shape":[2],"data_offsets":[0,8])"),
             "tensor 'w': dtype is a non-negative integer, expected a string");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":"2","data_offsets":[0,8])"),
             "tensor 'w': shape is a string, expected an array");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"),
             "tensor 'w': shape[0] is a non-integer number, expected a non-negative integer");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2],"data_offsets":{"begin":0})"),
             "tensor 'w': data_offsets is an object, expected [begin, end]");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2],"data_offsets":[0,8,8])"),
             "tensor 'w': data_offsets is an array of 3 values, expected [begin, end]");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2],"data_offsets":[null,8])"),
             "tensor 'w': data_offsets[0] is a null, expected a non-negative integer");
}

TEST_CASE("malformed: unknown dtypes, and 16-bit sizes") {
  Malformed m;
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8])"),
             m.prefix() + "tensor 'w': unknown dtype 'F8_E4M3' (weft reads F32, F64, I64, I32, U8, BOOL, F16, BF16)");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"f32","shape":[2],"data_offsets":[0,8])"), "unknown dtype 'f32'");
  // 16-bit entries are sized as such: 4 of them take 8 bytes, 8 of them 16.
  CHECK_CONTAINS(m.entry_error(R"("dtype":"BF16","shape":[8],"data_offsets":[0,8])"),
                 "tensor 'w': data_offsets [0, 8] hold 8 bytes but shape [8] of BF16 needs 16");
  CHECK(m.entry_error(R"("dtype":"F16","shape":[2,2],"data_offsets":[0,8])").empty());
}

TEST_CASE("malformed: negative, oversized and too many dims") {
  Malformed m;
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2,-1],"data_offsets":[0,8])"),
             m.prefix() + "tensor 'w': shape[1] is -1, negative");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8])"),
             "tensor 'w': shape[0] is 18446744073709551615, beyond 2^63 - 1");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])"),
             "tensor 'w': shape [4294967296,4294967296] has more elements than fit in 64 bits");
  // Even with a zero dim, the other dims' product must fit (weft derives strides from it).
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[4294967296,0,4294967296],"data_offsets":[0,0])", ""),
             "has more elements than fit in 64 bits");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8])"),
             "tensor 'w': shape [2305843009213693952] of F64 overflows a 64-bit byte size");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"U8","shape":[1,1,1,1,1,1,1,1,8],"data_offsets":[0,8])"),
             "tensor 'w': shape has 9 dims, weft tensors have at most 8");
}

TEST_CASE("malformed: data_offsets that are reversed, past the buffer or the wrong size") {
  Malformed m;
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[0],"data_offsets":[8,0])"),
             m.prefix() + "tensor 'w': data_offsets [8, 0] has begin > end");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"),
             "tensor 'w': data_offsets[0] is -8, negative");
  // A truncated file: the header promises 8 bytes, the file holds 5.
  const std::string header = R"({"w":{)" + kGoodFields + "}}";
  CHECK_CONTAINS(m.error(file_of(header, kTwoFloats.substr(0, 5))),
             "tensor 'w': data_offsets [0, 8] end past the data buffer of 5 bytes (file byte " +
                      std::to_string(8 + header.size() + 8) + ", file is " + std::to_string(8 + header.size() + 5) +
                      " bytes)");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615])"),
             "data_offsets[1] is 18446744073709551615, beyond 2^63 - 1");
  const std::string short_header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  CHECK_CONTAINS(m.error(file_of(short_header, kTwoFloats)),
             "tensor 'w': data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12 (at file byte " +
                      std::to_string(8 + short_header.size()) + ")");
  CHECK_CONTAINS(m.entry_error(R"("dtype":"F64","shape":[2],"data_offsets":[0,8])"),
             "hold 8 bytes but shape [2] of F64 needs 16");
}

TEST_CASE("malformed: overlapping, non-contiguous and trailing data") {
  Malformed m;
  auto two = [](const std::string& a, const std::string& b) {
    return R"({"a":{"dtype":"F32","shape":[1],"data_offsets":)" + a + R"(},"b":{"dtype":"F32","shape":[1],"data_offsets":)" +
           b + "}}";
  };
  CHECK_CONTAINS(m.error(file_of(two("[0,4]", "[2,6]"), kTwoFloats)),
             m.prefix() + "tensor 'b': data_offsets [2, 6] overlap tensor 'a' (which ends at buffer byte 4, file byte");
  CHECK_CONTAINS(m.error(file_of(two("[0,4]", "[0,4]"), kTwoFloats.substr(0, 4))), "overlap tensor 'a'");
  CHECK_CONTAINS(m.error(file_of(two("[0,4]", "[5,9]"), kTwoFloats + "x")),
             "tensor 'b': data_offsets [5, 9] leave a hole: buffer bytes 4 to 5");
  CHECK_CONTAINS(m.error(file_of(two("[1,5]", "[5,9]"), kTwoFloats + "x")),
             "tensor 'a': data_offsets [1, 5] leave a hole: buffer bytes 0 to 1");
  const std::string one = R"({"w":{)" + kGoodFields + "}}";
  CHECK_CONTAINS(m.error(file_of(one, kTwoFloats + "xyz")),
             m.prefix() + "trailing bytes: the tensors end at buffer byte 8 but the file goes on from byte " +
                      std::to_string(8 + one.size() + 8) + " to " + std::to_string(8 + one.size() + 11));
  CHECK_CONTAINS(m.error(file_of("{}", "x")), "trailing bytes: the tensors end at buffer byte 0");
}

TEST_CASE("malformed: duplicate names and duplicate keys") {
  Malformed m;
  const std::string entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  CHECK_CONTAINS(m.error(file_of(R"({"w":)" + entry + R"(,"w":)" + entry + "}", kTwoFloats.substr(0, 4))),
             m.prefix() + "the name 'w' appears twice in the header");
  CHECK_CONTAINS(m.entry_error(kGoodFields + R"(,"dtype":"F64")"), "entry 'w' has the key 'dtype' twice");
  CHECK_CONTAINS(m.error(file_of(R"({"__metadata__":{"k":"a","k":"b"}})", "")),
             "entry '__metadata__' has the key 'k' twice");
}

TEST_CASE("malformed: metadata that is not a map of strings") {
  Malformed m;
  CHECK_CONTAINS(m.error(file_of(R"({"__metadata__":["a"]})", "")),
             m.prefix() + "__metadata__ is an array, expected an object of strings");
  CHECK_CONTAINS(m.error(file_of(R"({"__metadata__":{"epoch":3}})", "")),
             "__metadata__ 'epoch' is a non-negative integer, expected a string");
}

TEST_CASE("malformed: BOOL bytes other than 0 and 1") {
  Malformed m;
  const std::string header = R"({"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  CHECK_CONTAINS(m.error(file_of(header, std::string("\x01\x00\x02", 3))),
             m.prefix() + "tensor 'b': BOOL element 2 is 2 (file byte " + std::to_string(8 + header.size() + 2) +
                      "), expected 0 or 1");
}

TEST_CASE("malformed: every truncation and every single-byte corruption of a valid file fails cleanly") {
  // Not a substitute for the cases above: a sweep that must never crash or read out of
  // bounds (run it under -fsanitize=address,undefined).
  Malformed m;
  save_safetensors(m.path, interop_tensors(), {{"format", "pt"}});
  const std::string good = read_bytes(m.path);
  int loaded = 0;
  for (size_t n = 0; n < good.size(); ++n) CHECK_CONTAINS(m.error(good.substr(0, n)), m.prefix());
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bytes = good;
    bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
    loaded += m.error(bytes).empty();
  }
  CHECK(loaded > 0);  // flips inside the data (f32, f64 values) load as other values
}

// --- interop with Python's safetensors: driven by safetensors_interop.py ----------

namespace {

std::string interop_dir() {
  const char* dir = std::getenv("WEFT_SAFETENSORS_INTEROP_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "run through safetensors_interop.py (it sets WEFT_SAFETENSORS_INTEROP_DIR)");
  return dir;
}

}  // namespace

TEST_CASE("interop weft writes" * doctest::skip()) {
  save_safetensors(interop_dir() + "/weft.safetensors", interop_tensors(), {{"format", "pt"}, {"written_by", "weft"}});
}

TEST_CASE("interop weft reads" * doctest::skip()) {
  const std::string dir = interop_dir();
  SafetensorsFile file = load_safetensors(dir + "/python.safetensors");
  CHECK(file.metadata == std::map<std::string, std::string>{{"written_by", "python"}});
  check_interop_tensors(file);
  SafetensorsFile f16 = load_safetensors(dir + "/python_f16.safetensors");
  REQUIRE(f16.tensors.size() == 1);
  CHECK(f16.tensors[0].second.dtype() == DType::Float16);
  CHECK(f16.tensors[0].second.to_vector<float>() == std::vector<float>{1.0f, -0.5f, 65504.0f, 0x1p-24f});
}
