// weft::data::TextCorpus / TextDataset on scratch files whose every byte is known: windows and
// shifted targets, split boundaries and sizes, batches, a directory's order and skipping rules,
// every error, sharding with DistributedSampler, the unigram entropy; then the default corpus
// (Debian's fortunes) when it is installed.
#include "test_util.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "data/dataloader.h"
#include "data/sampler.h"
#include "data/text_dataset.h"

using namespace weft;
using namespace weft::data;
using doctest::Contains;

namespace {

namespace fs = std::filesystem;
using Indices = std::vector<int64_t>;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  REQUIRE(out.good());
}

// n bytes, none NUL, high bytes included: byte i is (7 i + 3) mod 255 + 1.
std::string known_bytes(int64_t n) {
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>((7 * i + 3) % 255 + 1));
  return bytes;
}

Indices as_bytes(std::string_view bytes) {
  Indices out;
  for (char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

// A fresh scratch directory, removed when the test ends.
struct ScratchDir {
  explicit ScratchDir(const std::string& name) : path(test::scratch_path("weft_text_", name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return (fs::path(path) / name).string(); }
  std::string path;
};

}  // namespace

TEST_CASE("TextDataset: windows, targets shifted by one, split boundaries and sizes") {
  ScratchDir dir("windows");
  const std::string path = dir.file("corpus.txt");
  const std::string bytes = known_bytes(100);
  write_file(path, bytes);

  TextCorpus corpus = TextCorpus::open(path);  // val_fraction 0.1: bytes [0, 90) and [90, 100)
  CHECK(corpus.path() == path);
  CHECK(corpus.size() == 100);
  CHECK(corpus.bytes() == bytes);
  CHECK(corpus.val_fraction() == 0.1);
  CHECK(corpus.split_begin(Split::Train) == 0);
  CHECK(corpus.split_begin(Split::Validation) == 90);
  CHECK(corpus.bytes(Split::Train) == bytes.substr(0, 90));
  CHECK(corpus.bytes(Split::Validation) == bytes.substr(90));
  REQUIRE(corpus.files().size() == 1);
  CHECK(corpus.files()[0].path == path);
  CHECK(corpus.files()[0].offset == 0);
  CHECK(corpus.files()[0].size == 100);
  CHECK(corpus.skipped().empty());

  const int64_t block = 8;
  TextDataset train = corpus.split(Split::Train, block);
  CHECK(train.split() == Split::Train);
  CHECK(train.block_size() == block);
  CHECK(train.size() == (90 - 1) / block);  // 11: the last window, [80, 89), fits; [88, 97) would not
  for (int64_t i = 0; i < train.size(); ++i) {
    const std::string window = bytes.substr(i * block, block + 1);
    CHECK(train.window(i) == window);
    Example e = train.get(i);
    CHECK(e.data.dtype() == DType::Int64);
    CHECK(e.data.shape() == Shape{block});
    CHECK(e.target.shape() == Shape{block});
    CHECK(e.data.to_vector<int64_t>() == as_bytes(window.substr(0, block)));
    CHECK(e.target.to_vector<int64_t>() == as_bytes(window.substr(1)));
  }
  // Windows tile the split: the target's last byte is the next input's first.
  CHECK(train.get(3).target.to_vector<int64_t>().back() == train.get(4).data.to_vector<int64_t>().front());

  TextDataset val = corpus.split(Split::Validation, block);
  CHECK(val.size() == 1);
  CHECK(val.window(0) == bytes.substr(90, block + 1));
  CHECK(val.get(0).target.to_vector<int64_t>() == as_bytes(bytes.substr(91, block)));

  // The split's exact edge: n - 1 = 89 bytes of input take block 89 once, block 90 not at all.
  CHECK(corpus.split(Split::Train, 89).size() == 1);
  CHECK(corpus.split(Split::Train, 1).size() == 89);
  CHECK(corpus.split(Split::Validation, 9).size() == 1);

  CHECK_THROWS_WITH_AS(train.get(11), Contains("TextDataset::get: index 11 is out of range for a dataset of 11"),
                       Error);
  CHECK_THROWS_WITH_AS(train.window(-1), Contains("index -1 is out of range"), Error);

  // Other fractions: floor(n * (1 - val_fraction)) bytes train, as nanoGPT's int(n * 0.9).
  CHECK(TextCorpus::open(path, 0.25).split_begin(Split::Validation) == 75);
  CHECK(TextCorpus::open(path, 0.333).split_begin(Split::Validation) == 66);
  TextCorpus all = TextCorpus::open(path, 0);
  CHECK(all.bytes(Split::Train) == bytes);
  CHECK(all.bytes(Split::Validation).empty());
}

TEST_CASE("TextDataset: every copy views the one corpus; get_batch equals stacked get") {
  ScratchDir dir("batch");
  const std::string path = dir.file("corpus.txt");
  const std::string bytes = known_bytes(1000);
  write_file(path, bytes);

  TextDataset train = TextCorpus::open(path).split(Split::Train, 16);
  // The corpus handle may go: the dataset keeps the bytes alive, and copies share them.
  TextDataset copy = train;
  CHECK(copy.bytes().data() == train.bytes().data());
  CHECK(train.corpus().bytes().data() == train.bytes().data());
  TextDataset val = train.corpus().split(Split::Validation, 16);
  CHECK(val.bytes().data() == train.bytes().data() + 900);

  const Indices indices = {5, 0, 55, 5, 17};
  Batch batch = train.get_batch(indices);
  CHECK(batch.data.shape() == Shape{5, 16});
  CHECK(batch.target.shape() == Shape{5, 16});
  CHECK(batch.data.dtype() == DType::Int64);
  CHECK(batch.target.dtype() == DType::Int64);
  Batch stacked = train.Dataset::get_batch(indices);
  CHECK(batch.data.to_vector<int64_t>() == stacked.data.to_vector<int64_t>());
  CHECK(batch.target.to_vector<int64_t>() == stacked.target.to_vector<int64_t>());
  CHECK(batch.data.select(0, 2).to_vector<int64_t>() == as_bytes(bytes.substr(55 * 16, 16)));

  CHECK_THROWS_WITH_AS(train.get_batch({}), Contains("TextDataset::get_batch: the index list is empty"), Error);
  CHECK_THROWS_WITH_AS(train.get_batch({0, 56}),
                       Contains("TextDataset::get_batch: index 56 is out of range for a dataset of 56"), Error);
}

TEST_CASE("TextCorpus: a directory's text files in name order; symlinks, hidden, *.dat, binary skipped") {
  ScratchDir dir("dir");
  write_file(dir.file("b.txt"), "bee\n");
  write_file(dir.file("a"), "ay\n%\n");
  write_file(dir.file("Z"), "zed\n");  // byte-wise order: 'Z' (0x5a) before 'a' (0x61)
  write_file(dir.file("a.dat"), std::string("\0\0\0\2strfile", 11));
  write_file(dir.file("notes.dat"), "plain text, but a .dat name");
  write_file(dir.file(".hidden"), "hidden\n");
  write_file(dir.file("image"), std::string("PNG\0data", 8));
  write_file(dir.file("empty"), "");
  fs::create_symlink("a", dir.file("a.u8"));
  fs::create_directories(dir.file("off"));
  write_file(dir.file("off/rot13"), "bss\n");

  TextCorpus corpus = TextCorpus::open(dir.path, 0.5);
  CHECK(corpus.bytes() == "zed\nay\n%\nbee\n");
  REQUIRE(corpus.files().size() == 3);
  CHECK(corpus.files()[0].path == dir.file("Z"));
  CHECK(corpus.files()[1].path == dir.file("a"));
  CHECK(corpus.files()[2].path == dir.file("b.txt"));
  CHECK(corpus.files()[1].offset == 4);
  CHECK(corpus.files()[1].size == 5);
  CHECK(corpus.files()[2].offset == 9);
  const std::vector<std::string> skipped = {".hidden (hidden)",
                                            "a.dat (*.dat: a strfile index)",
                                            "a.u8 (symlink)",
                                            "empty (empty)",
                                            "image (binary: has a NUL byte)",
                                            "notes.dat (*.dat: a strfile index)",
                                            "off (directory: subdirectories are not entered)"};
  CHECK(corpus.skipped() == skipped);
  CHECK(corpus.split_begin(Split::Validation) == 6);  // floor(13 * 0.5)

  // A symlink named as the corpus itself is followed.
  fs::create_symlink(dir.file("b.txt"), dir.file("link"));
  CHECK(TextCorpus::open(dir.file("link")).bytes() == "bee\n");
}

TEST_CASE("TextCorpus / TextDataset: each error names the path and what was expected") {
  ScratchDir dir("errors");
  const std::string missing = dir.file("missing");
  CHECK_THROWS_WITH_AS(TextCorpus::open(missing),
                       Contains(("'" + missing + "' does not exist (expected a text file or a directory").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(TextCorpus::open(missing), Contains("apt-get install fortunes"), Error);

  const std::string empty_file = dir.file("empty.txt");
  write_file(empty_file, "");
  CHECK_THROWS_WITH_AS(TextCorpus::open(empty_file), Contains(("'" + empty_file + "' is empty").c_str()), Error);

  ScratchDir empty_dir("errors_empty_dir");
  CHECK_THROWS_WITH_AS(TextCorpus::open(empty_dir.path),
                       Contains(("the directory '" + empty_dir.path + "' is empty").c_str()), Error);

  ScratchDir no_text("errors_no_text");
  write_file(no_text.file("x.dat"), "index");
  write_file(no_text.file("y"), std::string("\x7f" "ELF\0", 5));
  CHECK_THROWS_WITH_AS(
      TextCorpus::open(no_text.path),
      Contains(("the directory '" + no_text.path + "' has no text files").c_str()), Error);
  CHECK_THROWS_WITH_AS(TextCorpus::open(no_text.path),
                       Contains("skipped: x.dat (*.dat: a strfile index), y (binary: has a NUL byte)"), Error);

  const std::string binary = dir.file("binary");
  write_file(binary, std::string("abc\0def", 7));
  CHECK_THROWS_WITH_AS(TextCorpus::open(binary),
                       Contains(("'" + binary + "' is binary, not text: it has a NUL byte at offset 3").c_str()),
                       Error);

  const std::string path = dir.file("short.txt");
  write_file(path, known_bytes(100));
  TextCorpus corpus = TextCorpus::open(path);
  CHECK_THROWS_WITH_AS(corpus.split(Split::Validation, 11),
                       Contains(("TextDataset: the validation split of '" + path +
                                 "' has 10 bytes (bytes 90 to 100 of 100, val_fraction 0.1), fewer than one window "
                                 "of block_size + 1 = 12 bytes")
                                    .c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(corpus.split(Split::Train, 90),
                       Contains(("the train split of '" + path + "' has 90 bytes").c_str()), Error);
  CHECK_THROWS_WITH_AS(TextCorpus::open(path, 0).split(Split::Validation, 1),
                       Contains("the validation split of '"), Error);
  CHECK_THROWS_WITH_AS(corpus.split(Split::Train, 0),
                       Contains(("TextDataset: block_size must be at least 1, got 0 (corpus '" + path + "')").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(corpus.split(Split::Train, -3), Contains("block_size must be at least 1, got -3"), Error);

  for (double bad : {1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(TextCorpus::open(path, bad),
                         Contains("val_fraction must be in [0, 1), got "), Error);
    CHECK_THROWS_WITH_AS(TextCorpus::open(path, bad), Contains(("(opening '" + path + "')").c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(TextCorpus::open(path, 0).unigram_entropy(Split::Validation),
                       Contains(("the validation split of '" + path + "' is empty").c_str()), Error);
}

TEST_CASE("TextDataset under DistributedSampler and the DataLoader: two ranks split the windows") {
  ScratchDir dir("sampler");
  const std::string path = dir.file("corpus.txt");
  write_file(path, known_bytes(1000));
  auto train = std::make_shared<TextDataset>(TextCorpus::open(path).split(Split::Train, 16));
  REQUIRE(train->size() == 56);

  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(train->size(), 2, rank, /*shuffle=*/true, /*seed=*/3);
    sampler->set_epoch(1);
    Indices indices = sampler->indices();
    CHECK(indices.size() == 28);
    for (int64_t i : indices) CHECK_MESSAGE(seen.insert(i).second, "sample ", i, " went to both ranks");

    // Batches from worker threads are those get_batch gives for the sampler's indices, in order.
    DataLoader loader(train, {.batch_size = 8, .num_workers = 2}, sampler);
    loader.set_epoch(1);
    size_t position = 0;
    for (Batch& batch : loader) {
      const int64_t rows = batch.data.size(0);
      Indices expected(indices.begin() + position, indices.begin() + position + rows);
      Batch direct = train->get_batch(expected);
      CHECK(batch.data.to_vector<int64_t>() == direct.data.to_vector<int64_t>());
      CHECK(batch.target.to_vector<int64_t>() == direct.target.to_vector<int64_t>());
      position += rows;
    }
    CHECK(position == indices.size());
  }
  CHECK(seen.size() == 56);
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == 55);
}

TEST_CASE("unigram entropy on known corpora; encode / decode") {
  CHECK(unigram_entropy("aaaa") == 0);
  CHECK(unigram_entropy("abcd") == doctest::Approx(std::log(4.0)).epsilon(1e-12));
  CHECK(unigram_entropy("aab") == doctest::Approx(std::log(3.0) - 2.0 / 3.0 * std::log(2.0)).epsilon(1e-12));
  CHECK_THROWS_WITH_AS(unigram_entropy(""), Contains("unigram_entropy: no bytes"), Error);

  ScratchDir dir("entropy");
  const std::string path = dir.file("corpus.txt");
  write_file(path, "aabbccddzzzzzzzz");
  TextCorpus corpus = TextCorpus::open(path, 0.5);  // train "aabbccdd", validation "zzzzzzzz"
  CHECK(corpus.unigram_entropy() == doctest::Approx(std::log(4.0)).epsilon(1e-12));
  CHECK(corpus.unigram_entropy(Split::Validation) == 0);

  const std::string text = std::string("GPT \xff\x01 bytes", 11);
  Tensor tokens = encode(text);
  CHECK(tokens.dtype() == DType::Int64);
  CHECK(tokens.shape() == Shape{11});
  CHECK(tokens.to_vector<int64_t>()[4] == 255);
  CHECK(decode(tokens) == text);
  CHECK(decode(tokens.to(DType::Int32).view({1, 11})) == text);
  CHECK(decode(encode("")) == "");
  CHECK_THROWS_WITH_AS(decode(tensor(Indices{72, 256})),
                       Contains("decode: token 256 at position 1 (row-major, of [2]) is not a byte value in 0 to 255"),
                       Error);
  CHECK_THROWS_WITH_AS(decode(tensor(Indices{-1})), Contains("token -1 at position 0"), Error);
  CHECK_THROWS_WITH_AS(decode(tensor({1.0f})), Contains("decode: expected integer tokens"), Error);
}

TEST_CASE("TextCorpus on the default corpus (Debian's fortunes)") {
  if (!fs::is_directory(kDefaultTextCorpus)) {
    MESSAGE("skipped: the fortunes package is not installed (apt-get install fortunes)");
    return;
  }
  TextCorpus corpus = TextCorpus::open(kDefaultTextCorpus);
  CHECK(corpus.size() > 1'000'000);
  CHECK(corpus.files().size() >= 10);
  int64_t total = 0;
  for (const TextFile& file : corpus.files()) {
    const std::string name = fs::path(file.path).filename().string();
    CHECK_MESSAGE(name.find(".dat") == std::string::npos, name);
    CHECK_MESSAGE(name.find(".u8") == std::string::npos, name);
    CHECK(file.offset == total);
    total += file.size;
  }
  CHECK(total == corpus.size());
  CHECK(corpus.split_begin(Split::Validation) == static_cast<int64_t>(std::floor(corpus.size() * 0.9)));

  const double entropy = corpus.unigram_entropy();
  // English prose with its capitals, digits and punctuation: 4-5 bits (2.8-3.5 nats) a byte without
  // context; fortunes' ASCII art puts it near the top. A uniform byte would be ln 256 = 5.5 nats.
  CHECK(entropy > 2.8);
  CHECK(entropy < 3.6);
  MESSAGE("fortunes: ", corpus.size(), " bytes in ", corpus.files().size(), " files (", corpus.skipped().size(),
          " skipped); train ", corpus.bytes(Split::Train).size(), " bytes, unigram entropy ", entropy,
          " nats; validation ", corpus.bytes(Split::Validation).size(), " bytes, ",
          corpus.unigram_entropy(Split::Validation), " nats");

  TextDataset train = corpus.split(Split::Train, 256);
  TextDataset val = corpus.split(Split::Validation, 256);
  CHECK(train.size() == (static_cast<int64_t>(corpus.bytes(Split::Train).size()) - 1) / 256);
  CHECK(val.size() == (static_cast<int64_t>(corpus.bytes(Split::Validation).size()) - 1) / 256);
  Example first = train.get(0);
  CHECK(decode(first.data) == corpus.bytes().substr(0, 256));
  Batch batch = train.get_batch({0, train.size() - 1});
  CHECK(decode(batch.target.select(0, 1)) == train.window(train.size() - 1).substr(1));
  MESSAGE("first window: ", decode(first.data).substr(0, 80));
}
