// TextCorpus (reading a file or a folder of text into one shared byte range) and TextDataset
// (windows over a split of it).
#include "data/text_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace weft::data {

namespace fs = std::filesystem;

// The corpus's bytes, read once. Exactly one of map (a single file, mapped read-only) and
// buffer (a directory's files, concatenated) holds them; bytes views whichever does. A mapped
// file must not shrink while the corpus lives (reading past its new end raises SIGBUS), as with
// any memory-mapped dataset.
struct TextCorpus::State {
  std::string path;
  double val_fraction = 0;
  int64_t train_size = 0;
  std::vector<TextFile> files;
  std::vector<std::string> skipped;
  std::string buffer;
  void* map = nullptr;
  size_t map_size = 0;
  std::string_view bytes;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (map != nullptr) ::munmap(map, map_size);
  }
};

const char* split_name(Split split) { return split == Split::Train ? "train" : "validation"; }

namespace {

constexpr const char* kExpectedText =
    "expected a text file or a directory of text files (regular files without NUL bytes, not *.dat strfile "
    "indexes, not hidden, not symlinks)";

// The offset of the first NUL byte, or -1.
int64_t find_nul(std::string_view bytes) {
  const void* nul = std::memchr(bytes.data(), 0, bytes.size());
  return nul == nullptr ? -1 : static_cast<const char*>(nul) - bytes.data();
}

// A single file: mapped, so that a large corpus costs page cache, not a private copy.
void map_file(const std::string& path, void*& map, size_t& map_size, std::string_view& bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  WEFT_CHECK(fd >= 0, "TextCorpus: cannot open '", path, "': ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    WEFT_FAIL("TextCorpus: cannot stat '", path, "': ", std::strerror(error));
  }
  if (info.st_size == 0) {
    ::close(fd);
    WEFT_FAIL("TextCorpus: '", path, "' is empty (", kExpectedText, ", of at least one byte)");
  }
  map_size = static_cast<size_t>(info.st_size);
  map = ::mmap(nullptr, map_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int error = errno;
  ::close(fd);  // the mapping keeps the file's pages reachable
  if (map == MAP_FAILED) {
    map = nullptr;
    WEFT_FAIL("TextCorpus: cannot map '", path, "' (", map_size, " bytes): ", std::strerror(error));
  }
  bytes = std::string_view(static_cast<const char*>(map), map_size);
}

}  // namespace

TextCorpus TextCorpus::open(const std::string& path, double val_fraction) {
  WEFT_CHECK(val_fraction >= 0 && val_fraction < 1, "TextCorpus: val_fraction must be in [0, 1), got ", val_fraction,
             " (opening '", path, "')");
  std::error_code error;
  fs::file_status status = fs::status(path, error);
  WEFT_CHECK(!error || status.type() == fs::file_type::not_found, "TextCorpus: cannot read '", path, "': ",
             error.message());
  WEFT_CHECK(fs::exists(status), "TextCorpus: '", path, "' does not exist (", kExpectedText, "; the default corpus ",
             kDefaultTextCorpus, " is the Debian package fortunes: apt-get install fortunes)");

  auto state = std::make_shared<State>();
  state->path = path;
  state->val_fraction = val_fraction;
  if (fs::is_regular_file(status)) {
    map_file(path, state->map, state->map_size, state->bytes);
    int64_t nul = find_nul(state->bytes);
    WEFT_CHECK(nul < 0, "TextCorpus: '", path, "' is binary, not text: it has a NUL byte at offset ", nul, " (",
               kExpectedText, ")");
    state->files.push_back({path, 0, static_cast<int64_t>(state->bytes.size())});
  } else if (fs::is_directory(status)) {
    std::vector<fs::directory_entry> entries;
    for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) entries.push_back(*it);
    WEFT_CHECK(!error, "TextCorpus: cannot list the directory '", path, "': ", error.message());
    WEFT_CHECK(!entries.empty(), "TextCorpus: the directory '", path, "' is empty (", kExpectedText, ")");
    std::sort(entries.begin(), entries.end(), [](const fs::directory_entry& a, const fs::directory_entry& b) {
      return a.path().filename().string() < b.path().filename().string();
    });
    for (const fs::directory_entry& entry : entries) {
      std::string name = entry.path().filename().string();
      const char* reason = nullptr;
      fs::file_type type = entry.symlink_status().type();
      if (type == fs::file_type::symlink) {
        reason = "symlink";
      } else if (type == fs::file_type::directory) {
        reason = "directory: subdirectories are not entered";
      } else if (type != fs::file_type::regular) {
        reason = "not a regular file";
      } else if (name[0] == '.') {
        reason = "hidden";
      } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".dat") == 0) {
        reason = "*.dat: a strfile index";
      }
      if (reason == nullptr) {
        std::ifstream in(entry.path(), std::ios::binary);
        WEFT_CHECK(in.good(), "TextCorpus: cannot open '", entry.path().string(), "' (in the corpus '", path,
                   "'): ", std::strerror(errno));
        std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (contents.empty()) {
          reason = "empty";
        } else if (find_nul(contents) >= 0) {
          reason = "binary: has a NUL byte";
        } else {
          state->files.push_back({entry.path().string(), static_cast<int64_t>(state->buffer.size()),
                                  static_cast<int64_t>(contents.size())});
          state->buffer += contents;
        }
      }
      if (reason != nullptr) state->skipped.push_back(name + " (" + reason + ")");
    }
    if (state->files.empty()) {
      std::string skipped;
      for (size_t i = 0; i < state->skipped.size(); ++i) skipped += (i ? ", " : "") + state->skipped[i];
      WEFT_FAIL("TextCorpus: the directory '", path, "' has no text files (", kExpectedText, "); skipped: ", skipped);
    }
    state->bytes = state->buffer;
  } else {
    WEFT_FAIL("TextCorpus: '", path, "' is neither a regular file nor a directory (", kExpectedText, ")");
  }
  const double n = static_cast<double>(state->bytes.size());
  state->train_size = static_cast<int64_t>(std::floor(n * (1.0 - val_fraction)));
  return TextCorpus(std::move(state));
}

const std::string& TextCorpus::path() const { return state_->path; }
double TextCorpus::val_fraction() const { return state_->val_fraction; }
std::string_view TextCorpus::bytes() const { return state_->bytes; }
const std::vector<TextFile>& TextCorpus::files() const { return state_->files; }
const std::vector<std::string>& TextCorpus::skipped() const { return state_->skipped; }

int64_t TextCorpus::split_begin(Split split) const { return split == Split::Train ? 0 : state_->train_size; }

std::string_view TextCorpus::bytes(Split split) const {
  return split == Split::Train ? state_->bytes.substr(0, state_->train_size) : state_->bytes.substr(state_->train_size);
}

TextDataset TextCorpus::split(Split split, int64_t block_size) const { return TextDataset(*this, split, block_size); }

double TextCorpus::unigram_entropy(Split split) const {
  std::string_view split_bytes = bytes(split);
  WEFT_CHECK(!split_bytes.empty(), "TextCorpus::unigram_entropy: the ", split_name(split), " split of '", path(),
             "' is empty (val_fraction ", val_fraction(), ")");
  return data::unigram_entropy(split_bytes);
}

// --- TextDataset ---------------------------------------------------------------------

TextDataset::TextDataset(TextCorpus corpus, Split split, int64_t block_size)
    : corpus_(std::move(corpus)), split_(split), block_size_(block_size) {
  WEFT_CHECK(block_size >= 1, "TextDataset: block_size must be at least 1, got ", block_size, " (corpus '",
             corpus_.path(), "')");
  bytes_ = corpus_.bytes(split);
  const int64_t n = static_cast<int64_t>(bytes_.size());
  const int64_t begin = corpus_.split_begin(split);
  WEFT_CHECK(n >= block_size + 1, "TextDataset: the ", split_name(split), " split of '", corpus_.path(), "' has ", n,
             " bytes (bytes ", begin, " to ", begin + n, " of ", corpus_.size(), ", val_fraction ",
             corpus_.val_fraction(), "), fewer than one window of block_size + 1 = ", block_size + 1, " bytes");
  size_ = (n - 1) / block_size;
}

std::string_view TextDataset::window(int64_t index) const {
  check_index(index, "TextDataset::window");
  return bytes_.substr(static_cast<size_t>(index * block_size_), static_cast<size_t>(block_size_ + 1));
}

namespace {

// input[t] = window[t], target[t] = window[t + 1] for t < block_size.
void fill_window(std::string_view window, int64_t* input, int64_t* target) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(window.data());
  const int64_t block_size = static_cast<int64_t>(window.size()) - 1;
  for (int64_t t = 0; t < block_size; ++t) {
    input[t] = bytes[t];
    target[t] = bytes[t + 1];
  }
}

}  // namespace

Example TextDataset::get(int64_t index) const {
  check_index(index, "TextDataset::get");
  Example example;
  example.data = empty({block_size_}, DType::Int64);
  example.target = empty({block_size_}, DType::Int64);
  fill_window(window(index), example.data.data_ptr<int64_t>(), example.target.data_ptr<int64_t>());
  return example;
}

Batch TextDataset::get_batch(const std::vector<int64_t>& indices) const {
  WEFT_CHECK(!indices.empty(), "TextDataset::get_batch: the index list is empty (a batch needs at least one sample)");
  for (int64_t index : indices) check_index(index, "TextDataset::get_batch");
  const int64_t batch_size = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.data = empty({batch_size, block_size_}, DType::Int64);
  batch.target = empty({batch_size, block_size_}, DType::Int64);
  int64_t* input = batch.data.data_ptr<int64_t>();
  int64_t* target = batch.target.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    fill_window(bytes_.substr(static_cast<size_t>(indices[b] * block_size_), static_cast<size_t>(block_size_ + 1)),
                input + b * block_size_, target + b * block_size_);
  }
  return batch;
}

// --- helpers -------------------------------------------------------------------------

double unigram_entropy(std::string_view bytes) {
  WEFT_CHECK(!bytes.empty(), "unigram_entropy: no bytes (the entropy of an empty distribution is undefined)");
  std::array<int64_t, 256> counts{};
  for (char c : bytes) ++counts[static_cast<unsigned char>(c)];
  const double n = static_cast<double>(bytes.size());
  double entropy = 0;
  for (int64_t count : counts) {
    if (count == 0) continue;
    double p = static_cast<double>(count) / n;
    entropy -= p * std::log(p);
  }
  return entropy;
}

Tensor encode(std::string_view text) {
  Tensor tokens = empty({static_cast<int64_t>(text.size())}, DType::Int64);
  int64_t* out = tokens.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string decode(const Tensor& tokens) {
  WEFT_CHECK(tokens.defined(), "decode: the token tensor is undefined");
  DType dtype = tokens.dtype();
  WEFT_CHECK(dtype == DType::Int64 || dtype == DType::Int32 || dtype == DType::UInt8,
             "decode: expected integer tokens (int64, int32 or uint8), got ", dtype, " ", tokens.shape());
  std::vector<int64_t> values = tokens.detach().to_vector<int64_t>();
  std::string text(values.size(), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    WEFT_CHECK(values[i] >= 0 && values[i] < kTextVocabSize, "decode: token ", values[i], " at position ", i,
               " (row-major, of ", tokens.shape(), ") is not a byte value in 0 to 255");
    text[i] = static_cast<char>(static_cast<unsigned char>(values[i]));
  }
  return text;
}

}  // namespace weft::data
