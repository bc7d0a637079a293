// Byte-level text for GPT training: a corpus read once, cut into a training and a validation byte
// range, and datasets of fixed-length windows over one range (nanoGPT's data pipeline without a
// tokenizer: the vocabulary is the 256 byte values, so there are no tokenizer files to find).
//
//   auto corpus = data::TextCorpus::open(data::kDefaultTextCorpus);  // val_fraction 0.1
//   auto train = std::make_shared<data::TextDataset>(corpus.split(data::Split::Train, 256));
//   auto val = std::make_shared<data::TextDataset>(corpus.split(data::Split::Validation, 256));
//   double baseline = corpus.unigram_entropy();  // the loss (nats) a model must beat
//   data::DataLoader loader(train, {.batch_size = 32, .shuffle = true, .num_workers = 2});
//
// The bytes live once per process: a TextCorpus is a handle on one read-only memory map (a
// single file) or one buffer (a directory's files, which must be concatenated anyway), and
// every copy of the corpus and every dataset made from it shares them through a shared_ptr.
// A sample copies only its own window. Nothing here draws random numbers: the sampler shuffles.
//
// Note [Text windows]:
// - n corpus bytes; the training split is bytes [0, floor(n * (1 - val_fraction))), the
//   validation split the rest (nanoGPT: train = data[:int(n * 0.9)]).
// - Sample i of a split is its window of block_size + 1 bytes starting at i * block_size:
//   input = window[0, block_size), target = window[1, block_size + 1), the next byte of each.
// - size() = (split bytes - 1) / block_size: inputs tile the split without overlap, a target
//   window reaches one byte into the next input, and the last incomplete window is dropped.
//
// Note [What a text corpus reads]:
// - A file path (a symlink to a file is followed): that file's bytes. A NUL byte is an error.
// - A directory: its entries that are regular files and not symlinks (Debian's fortunes has
//   `art.u8 -> art`; following it would read `art` twice), whose names do not start with '.'
//   (hidden) nor end in ".dat" (strfile's binary indexes), that are not empty and that have no
//   NUL byte ("text": NUL never occurs in text in any ASCII-compatible encoding, and is in
//   nearly every binary format). They are concatenated in byte-wise name order, with nothing
//   put between. Subdirectories are not entered: a corpus is one folder's files (fortunes-off
//   installs an off/ folder of rot13-encoded text, which must not be mixed in).
//   files() lists what was read, skipped() what was not and why.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace weft::data {

// The Debian package `fortunes` (apt-get install fortunes): about 2.5 MB of real English prose,
// quotations and dialogue in about 40 files, a corpus that a small GPT learns in minutes on two
// CPU cores. The *.dat files beside them are strfile indexes (binary, skipped) and *.u8 are
// symlinks (skipped); the `%` lines that separate fortunes are kept as text.
inline constexpr const char* kDefaultTextCorpus = "/usr/share/games/fortunes";
// Tokens are bytes.
inline constexpr int64_t kTextVocabSize = 256;

enum class Split { Train, Validation };
// "train", "validation".
const char* split_name(Split split);

// One file of a corpus: its bytes are bytes()[offset, offset + size).
struct TextFile {
  std::string path;
  int64_t offset = 0;
  int64_t size = 0;
};

class TextDataset;

class TextCorpus {
 public:
  // Reads `path` (Note [What a text corpus reads]). Fails, naming the path and what was
  // expected, on a missing path, an empty file or directory, a directory without text files,
  // a file with a NUL byte, or val_fraction outside [0, 1).
  static TextCorpus open(const std::string& path, double val_fraction = 0.1);

  const std::string& path() const;
  double val_fraction() const;
  // All n bytes, and one split's (Note [Text windows]).
  std::string_view bytes() const;
  std::string_view bytes(Split split) const;
  int64_t size() const { return static_cast<int64_t>(bytes().size()); }
  // Where a split starts in bytes(): 0 for Train, the training split's size for Validation.
  int64_t split_begin(Split split) const;

  // The files read, in order (one for a file path), and "name (reason)" for each directory
  // entry left out.
  const std::vector<TextFile>& files() const;
  const std::vector<std::string>& skipped() const;

  // The windows of one split. Fails when block_size < 1 or the split has fewer than
  // block_size + 1 bytes.
  TextDataset split(Split split, int64_t block_size) const;

  // The entropy, in nats, of the split's byte frequencies: the cross-entropy of the best model
  // that ignores context, i.e. the loss a GPT has to get below to have learned anything.
  double unigram_entropy(Split split = Split::Train) const;

 private:
  struct State;
  explicit TextCorpus(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// Sample i: (input int64 [block_size], target int64 [block_size]) of Note [Text windows].
// get_batch() fills [B, block_size] tensors directly from the bytes (no per-sample stack).
class TextDataset : public Dataset {
 public:
  TextDataset(TextCorpus corpus, Split split, int64_t block_size);

  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  // Sample index's block_size + 1 bytes, a view into the corpus.
  std::string_view window(int64_t index) const;
  // This split's bytes.
  std::string_view bytes() const { return bytes_; }
  int64_t block_size() const { return block_size_; }
  Split split() const { return split_; }
  const TextCorpus& corpus() const { return corpus_; }

 private:
  TextCorpus corpus_;
  Split split_;
  int64_t block_size_;
  std::string_view bytes_;
  int64_t size_;
};

// -sum_b p(b) log p(b) over the byte frequencies of `bytes`, in nats; fails on no bytes.
double unigram_entropy(std::string_view bytes);

// Text -> int64 [len] of its byte values, and back: tokens of any integer dtype and shape
// (read in row-major order), each in [0, 255]. For printing samples and prompting a model.
Tensor encode(std::string_view text);
std::string decode(const Tensor& tokens);

}  // namespace weft::data
