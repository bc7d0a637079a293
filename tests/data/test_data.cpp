// weft::data datasets and samplers: shapes and values of TensorDataset / FashionMNIST
// (synthetic IDX files, and the real set when installed), sampler sequences worked out by
// hand, and DistributedSampler's arithmetic against PyTorch's formulas.
#include "test_util.h"

#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "data/dataset.h"
#include "data/sampler.h"

using namespace weft;
using namespace weft::data;
using doctest::Contains;

namespace {

using Indices = std::vector<int64_t>;

// Sample i: data [2] = {i, -i}, target i (0-d int64), from get() only: exercises
// Dataset's default get_batch.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override {
    check_index(index, "CountingDataset::get");
    double v = static_cast<double>(index);
    return {tensor(std::vector<double>{v, -v}), scalar_tensor(v, DType::Int64)};
  }

 private:
  int64_t n_;
};

// Targets only for even indices: the default get_batch must refuse to mix.
class HalfLabelled : public CountingDataset {
 public:
  using CountingDataset::CountingDataset;
  Example get(int64_t index) const override {
    Example e = CountingDataset::get(index);
    if (index % 2) e.target = Tensor();
    return e;
  }
};

std::string idx_bytes(int code, std::vector<uint32_t> dims, const std::string& values) {
  std::string h = {0, 0, static_cast<char>(code), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) h.push_back(static_cast<char>((d >> s) & 0xff));
  return h + values;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("weft_test_data_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(dir);
  return dir;
}

// PyTorch's DistributedSampler.__init__, in floating point as Python computes it.
int64_t torch_num_samples(int64_t n, int64_t replicas, bool drop_last) {
  if (drop_last && n % replicas != 0) return static_cast<int64_t>(std::ceil((n - replicas) / double(replicas)));
  return static_cast<int64_t>(std::ceil(n / double(replicas)));
}

}  // namespace

// --- datasets ------------------------------------------------------------------------

TEST_CASE("TensorDataset: sizes, rows, batches and errors") {
  Tensor x = test::random({7, 3, 2}, DType::Float32, 11);
  Tensor y = tensor(Indices{0, 3, 6, 9, 12, 15, 18});
  TensorDataset ds(x, y);
  CHECK(ds.size() == 7);
  Example e = ds.get(4);
  CHECK(e.data.shape() == Shape{3, 2});
  CHECK(e.data.to_vector<float>() == x.select(0, 4).to_vector<float>());
  CHECK(e.target.item<int64_t>() == 12);

  Batch b = ds.get_batch({6, 0, 6, 2});
  CHECK(b.data.shape() == Shape{4, 3, 2});
  CHECK(b.data.dtype() == DType::Float32);
  CHECK(b.target.dtype() == DType::Int64);
  CHECK(b.target.to_vector<int64_t>() == Indices{18, 0, 18, 6});
  CHECK(b.data.select(0, 3).to_vector<float>() == x.select(0, 2).to_vector<float>());
  // The override and the default (stacking get()) agree.
  Batch stacked = ds.Dataset::get_batch({6, 0, 6, 2});
  CHECK(stacked.data.to_vector<float>() == b.data.to_vector<float>());
  CHECK(stacked.target.to_vector<int64_t>() == b.target.to_vector<int64_t>());

  // Unlabelled rows, and datasets are detached from any graph.
  TensorDataset unlabelled(test::leaf({4, 2}, 12), Tensor());
  CHECK_FALSE(unlabelled.get_batch({1, 2}).target.defined());
  CHECK_FALSE(unlabelled.data().requires_grad());

  CHECK_THROWS_WITH_AS(TensorDataset(x, arange(6)),
                       Contains("same first dim (one row per sample), got data [7, 3, 2] and targets [6]"), Error);
  CHECK_THROWS_WITH_AS(TensorDataset(scalar_tensor(1.0), Tensor()), Contains("data must have at least one dim"), Error);
  CHECK_THROWS_WITH_AS(TensorDataset(Tensor(), y), Contains("the data tensor is undefined"), Error);
  CHECK_THROWS_WITH_AS(ds.get(7), Contains("TensorDataset::get: index 7 is out of range for a dataset of 7 samples "
                                           "(valid: 0 to 6)"),
                       Error);
  CHECK_THROWS_WITH_AS(ds.get(-1), Contains("index -1 is out of range"), Error);
  CHECK_THROWS_WITH_AS(ds.get_batch({0, 9}), Contains("TensorDataset::get_batch: index 9 is out of range"), Error);
  CHECK_THROWS_WITH_AS(ds.get_batch({}), Contains("the index list is empty"), Error);
}

TEST_CASE("Dataset::get_batch stacks get() results") {
  CountingDataset ds(5);
  Batch b = ds.get_batch({3, 1, 4});
  CHECK(b.data.shape() == Shape{3, 2});
  CHECK(b.data.to_vector<double>() == std::vector<double>{3, -3, 1, -1, 4, -4});
  CHECK(b.target.shape() == Shape{3});
  CHECK(b.target.to_vector<int64_t>() == Indices{3, 1, 4});
  CHECK_THROWS_WITH_AS(ds.get_batch({1, 5}), Contains("Dataset::get_batch: index 5 is out of range for a dataset of 5"),
                       Error);
  CHECK_THROWS_WITH_AS(ds.get_batch({}), Contains("the index list is empty"), Error);
  HalfLabelled half(4);
  CHECK_THROWS_WITH_AS(half.get_batch({0, 1}), Contains("get(1) returned no target, unlike get(0)"), Error);
  CHECK_THROWS_WITH_AS(half.get_batch({1, 2}), Contains("get(2) returned a target, unlike get(1)"), Error);
}

TEST_CASE("FashionMNIST on synthetic IDX files: values, plain and gzip'd, errors") {
  auto dir = scratch_dir("fmnist");
  // Three 28x28 images whose pixels run through byte values; labels 9, 0, 4.
  std::string pixels(3 * 784, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>((i * 7) % 256);
  std::ofstream(dir / "train-images-idx3-ubyte", std::ios::binary) << idx_bytes(0x08, {3, 28, 28}, pixels);
  write_gz((dir / "train-labels-idx1-ubyte.gz").string(), idx_bytes(0x08, {3}, std::string("\x09\x00\x04", 3)));

  FashionMNIST raw(dir.string(), true, false);
  FashionMNIST normalised(dir.string(), true);
  CHECK(raw.size() == 3);
  CHECK(raw.data().shape() == Shape{3, 1, 28, 28});
  CHECK(raw.data().dtype() == DType::Float32);
  CHECK(raw.targets().dtype() == DType::Int64);
  CHECK(raw.targets().to_vector<int64_t>() == Indices{9, 0, 4});
  auto r = raw.data().to_vector<float>();
  auto z = normalised.data().to_vector<float>();
  for (size_t i = 0; i < pixels.size(); i += 97) {
    float v = static_cast<unsigned char>(pixels[i]);
    CHECK(r[i] == v / 255.0f);
    CHECK(z[i] == (v / 255.0f - 0.2860f) / 0.3530f);
  }
  CHECK(r[2] == 14.0f / 255.0f);
  CHECK(FashionMNIST::classes().size() == 10);
  CHECK(FashionMNIST::classes()[9] == "Ankle boot");

  // The test split is missing here: the error names both paths tried and the package.
  CHECK_THROWS_WITH_AS(FashionMNIST(dir.string(), false),
                       Contains(("neither '" + (dir / "t10k-images-idx3-ubyte").string() + "' nor '" +
                                 (dir / "t10k-images-idx3-ubyte.gz").string() + "' exists")
                                    .c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(FashionMNIST(dir.string(), false), Contains("dataset-fashion-mnist"), Error);
  CHECK_THROWS_WITH_AS(FashionMNIST("/nonexistent/fmnist"),
                       Contains("the directory '/nonexistent/fmnist' does not exist; install the Debian package "
                                "dataset-fashion-mnist"),
                       Error);
  // A file given for the directory is named as such, not as a missing directory.
  CHECK_THROWS_WITH_AS(FashionMNIST((dir / "train-labels-idx1-ubyte.gz").string()),
                       Contains("is not a directory (give the directory that holds"), Error);

  // Malformed content: a label outside 0..9, counts that disagree, wrong image size.
  write_gz((dir / "train-labels-idx1-ubyte.gz").string(), idx_bytes(0x08, {3}, std::string("\x09\x0a\x04", 3)));
  CHECK_THROWS_WITH_AS(FashionMNIST(dir.string()), Contains("label 10 of sample 1 is not a class in 0 to 9"), Error);
  write_gz((dir / "train-labels-idx1-ubyte.gz").string(), idx_bytes(0x08, {2}, std::string("\x09\x00", 2)));
  CHECK_THROWS_WITH_AS(FashionMNIST(dir.string()), Contains("has 3 images but"), Error);
  std::ofstream(dir / "train-images-idx3-ubyte", std::ios::binary)
      << idx_bytes(0x08, {2, 4, 4}, std::string(32, '\x01'));
  CHECK_THROWS_WITH_AS(FashionMNIST(dir.string()), Contains("holds uint8 [2, 4, 4], expected uint8 [N, 28, 28]"),
                       Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("FashionMNIST from the Debian package") {
  if (!std::filesystem::exists(std::string(kFashionMnistDefaultRoot) + "/t10k-labels-idx1-ubyte.gz")) {
    MESSAGE("skipped: dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)");
    return;
  }
  FashionMNIST train;
  CHECK(train.size() == 60000);
  CHECK(train.data().shape() == Shape{60000, 1, 28, 28});
  CHECK(train.targets().shape() == Shape{60000});
  // Normalised with the training set's own statistics: mean ~0, std ~1.
  auto mean = train.data().to_vector<float>();
  double sum = 0, sum_sq = 0;
  for (float v : mean) {
    sum += v;
    sum_sq += double(v) * v;
  }
  double m = sum / mean.size(), s = std::sqrt(sum_sq / mean.size() - m * m);
  CHECK(std::fabs(m) < 1e-3);
  CHECK(std::fabs(s - 1) < 1e-3);

  FashionMNIST test(kFashionMnistDefaultRoot, false, false);
  CHECK(test.size() == 10000);
  auto t = test.targets().to_vector<int64_t>();
  std::map<int64_t, int> per_class;
  for (int64_t c : t) per_class[c]++;
  CHECK(per_class.size() == 10);
  CHECK(per_class[0] == 1000);  // the test set is balanced
  auto raw = test.data().to_vector<float>();
  CHECK(*std::min_element(raw.begin(), raw.end()) == 0.0f);
  CHECK(*std::max_element(raw.begin(), raw.end()) == 1.0f);
}

// --- samplers ------------------------------------------------------------------------

TEST_CASE("SequentialSampler, RandomSampler") {
  SequentialSampler seq(5);
  CHECK(seq.size() == 5);
  CHECK(seq.indices() == Indices{0, 1, 2, 3, 4});
  CHECK(SequentialSampler(0).indices().empty());

  RandomSampler a(50, 7), b(50, 7), other_seed(50, 8);
  Indices first = a.indices();
  CHECK(a.size() == 50);
  CHECK(first == b.indices());   // runs repeat
  CHECK(first == a.indices());   // and a pass does not change the order by itself
  CHECK(first != other_seed.indices());
  Indices sorted = first;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == SequentialSampler(50).indices());
  CHECK(first != sorted);
  a.set_epoch(1);
  CHECK(a.epoch() == 1);
  CHECK(a.indices() != first);  // epochs differ
  b.set_epoch(1);
  CHECK(a.indices() == b.indices());
  // (seed, epoch) pairs that add up to the same value still differ.
  RandomSampler c(50, 6);
  c.set_epoch(2);
  CHECK(c.indices() != a.indices());

  CHECK_THROWS_WITH_AS(SequentialSampler(-1), Contains("SequentialSampler: the dataset size must be non-negative"),
                       Error);
  CHECK_THROWS_WITH_AS(RandomSampler(-3), Contains("RandomSampler: the dataset size must be non-negative, got -3"),
                       Error);
}

TEST_CASE("BatchSampler: batches, drop_last, epochs") {
  auto seq = std::make_shared<SequentialSampler>(10);
  BatchSampler keep(seq, 3, false), drop(seq, 3, true);
  CHECK(keep.size() == 4);
  CHECK(keep.batches() == std::vector<Indices>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}});
  CHECK(drop.size() == 3);
  CHECK(drop.batches() == std::vector<Indices>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}});
  CHECK(BatchSampler(seq, 5, true).batches() == std::vector<Indices>{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}});
  CHECK(BatchSampler(seq, 20, false).batches() == std::vector<Indices>{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}});
  CHECK(BatchSampler(seq, 20, true).size() == 0);
  CHECK(BatchSampler(seq, 20, true).batches().empty());

  auto rnd = std::make_shared<RandomSampler>(10, 3);
  BatchSampler shuffled(rnd, 4, false);
  auto epoch0 = shuffled.batches();
  shuffled.set_epoch(5);
  CHECK(rnd->epoch() == 5);
  auto epoch5 = shuffled.batches();
  CHECK(epoch0 != epoch5);
  Indices flat;
  for (auto& b : epoch5) flat.insert(flat.end(), b.begin(), b.end());
  CHECK(flat == rnd->indices());

  CHECK_THROWS_WITH_AS(BatchSampler(seq, 0, false), Contains("batch_size must be at least 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(BatchSampler(nullptr, 2, false), Contains("BatchSampler: the sampler is null"), Error);
}

TEST_CASE("DistributedSampler: 10 samples over 3 replicas, by hand") {
  std::vector<Indices> expected = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
  for (int64_t r = 0; r < 3; ++r) {
    DistributedSampler s(10, 3, r, /*shuffle=*/false);
    CHECK(s.num_samples() == 4);
    CHECK(s.total_size() == 12);
    CHECK(s.size() == 4);
    CHECK(s.indices() == expected[r]);
  }
  std::vector<Indices> dropped = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
  for (int64_t r = 0; r < 3; ++r) {
    DistributedSampler s(10, 3, r, false, 0, /*drop_last=*/true);
    CHECK(s.num_samples() == 3);
    CHECK(s.total_size() == 9);
    CHECK(s.indices() == dropped[r]);
  }
  // Fewer samples than replicas: the list [0, 1] wraps around more than once.
  std::vector<Indices> wrapped = {{0}, {1}, {0}, {1}, {0}};
  for (int64_t r = 0; r < 5; ++r) CHECK(DistributedSampler(2, 5, r, false).indices() == wrapped[r]);
  for (int64_t r = 0; r < 5; ++r) CHECK(DistributedSampler(2, 5, r, false, 0, true).indices().empty());
  // 7 over 2 with padding by one: [0..6, 0].
  CHECK(DistributedSampler(7, 2, 0, false).indices() == Indices{0, 2, 4, 6});
  CHECK(DistributedSampler(7, 2, 1, false).indices() == Indices{1, 3, 5, 0});
  CHECK(DistributedSampler(0, 4, 3, false).indices().empty());
}

TEST_CASE("DistributedSampler: PyTorch's counts, coverage, shuffle seeded seed + epoch") {
  for (int64_t n : {0, 1, 2, 5, 9, 10, 11, 12, 31, 64, 100}) {
    for (int64_t replicas : {1, 2, 3, 4, 7, 8}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          const int64_t num_samples = torch_num_samples(n, replicas, drop_last);
          CAPTURE(n);
          CAPTURE(replicas);
          CAPTURE(drop_last);
          CAPTURE(shuffle);
          // Rebuild the global list by interleaving the ranks' shares: it must be the
          // permutation, then (without drop_last) the permutation again from its start.
          Indices global(num_samples * replicas);
          for (int64_t r = 0; r < replicas; ++r) {
            DistributedSampler s(n, replicas, r, shuffle, 42, drop_last);
            s.set_epoch(3);
            CHECK(s.num_samples() == num_samples);
            CHECK(s.total_size() == num_samples * replicas);
            Indices mine = s.indices();
            REQUIRE(static_cast<int64_t>(mine.size()) == num_samples);
            for (int64_t k = 0; k < num_samples; ++k) global[k * replicas + r] = mine[k];
          }
          Indices perm = SequentialSampler(n).indices();
          if (shuffle) {
            Generator gen(42 + 3);
            perm = randperm(n, DType::Int64, &gen).to_vector<int64_t>();
          }
          for (size_t i = 0; i < global.size(); ++i) CHECK(global[i] == perm[i % n]);
          std::set<int64_t> seen(global.begin(), global.end());
          if (!drop_last) CHECK(static_cast<int64_t>(seen.size()) == n);  // every index is covered
          if (drop_last) CHECK(static_cast<int64_t>(global.size()) == n - n % replicas);
        }
      }
    }
  }

  // Epochs reshuffle; (seed, epoch) enters as seed + epoch, exactly as in PyTorch.
  DistributedSampler a(20, 2, 1), b(20, 2, 1, true, 1);
  Indices epoch0 = a.indices();
  a.set_epoch(1);
  CHECK(a.indices() != epoch0);
  CHECK(a.indices() == b.indices());
  a.set_epoch(0);
  CHECK(a.indices() == epoch0);
}

TEST_CASE("set_start: SequentialSampler, RandomSampler and BatchSampler skip the consumed prefix") {
  SequentialSampler seq(7);
  seq.set_start(3);
  CHECK(seq.start() == 3);
  CHECK(seq.size() == 4);
  CHECK(seq.indices() == Indices{3, 4, 5, 6});
  for (int64_t past_the_end : {7, 100}) {
    seq.set_start(past_the_end);
    CHECK(seq.size() == 0);
    CHECK(seq.indices().empty());
  }
  seq.set_start(0);
  CHECK(seq.indices() == SequentialSampler(7).indices());

  RandomSampler whole(20, 4), rest(20, 4);
  whole.set_epoch(2);
  rest.set_epoch(2);
  rest.set_start(6);
  const Indices all = whole.indices();
  CHECK(rest.size() == 14);
  CHECK(rest.indices() == Indices(all.begin() + 6, all.end()));

  auto inner = std::make_shared<SequentialSampler>(10);
  BatchSampler batches(inner, 3, false);
  batches.set_start(6);
  CHECK(inner->start() == 6);
  CHECK(batches.start() == 6);
  CHECK(batches.first_batch() == 2);
  CHECK(batches.size() == 2);
  CHECK(batches.batches() == std::vector<Indices>{{6, 7, 8}, {9}});

  CHECK_THROWS_WITH_AS(seq.set_start(-1), Contains("Sampler::set_start: the samples consumed must be non-negative, "
                                                   "got -1"), Error);
  // Evaluation runs whole: 0 is accepted, anything else refused rather than ignored.
  DistributedEvalSampler eval(10, 2, 0);
  eval.set_start(0);
  CHECK_THROWS_WITH_AS(eval.set_start(4), Contains("Sampler::set_start(4): this sampler cannot start part-way into "
                                                   "an epoch"), Error);
}

TEST_CASE("DistributedSampler::set_start: sampler.h's example, by hand") {
  // n = 10 unshuffled; 2 steps of 1 sample on 2 ranks trained {0, 2} and {1, 3}: C = 4.
  auto shards = [](int64_t replicas, bool drop_last) {
    std::vector<Indices> out;
    for (int64_t r = 0; r < replicas; ++r) {
      DistributedSampler s(10, replicas, r, /*shuffle=*/false, 0, drop_last);
      s.set_start(4);
      CHECK(s.size() == static_cast<int64_t>(s.indices().size()));
      out.push_back(s.indices());
    }
    return out;
  };
  CHECK(shards(3, false) == std::vector<Indices>{{4, 7}, {5, 8}, {6, 9}});
  CHECK(shards(4, false) == std::vector<Indices>{{4, 8}, {5, 9}, {6, 0}, {7, 1}});  // padded with G[0], G[1]
  CHECK(shards(4, true) == std::vector<Indices>{{4}, {5}, {6}, {7}});
  CHECK(shards(2, false) == std::vector<Indices>{{4, 6, 8}, {5, 7, 9}});  // the same world: the rest of each list
  CHECK(shards(1, false) == std::vector<Indices>{{4, 5, 6, 7, 8, 9}});

  DistributedSampler s(10, 4, 1, false);
  s.set_start(4);
  CHECK(s.num_samples() == 2);
  CHECK(s.total_size() == 8);
  CHECK(s.local_start() == 1);  // 4 global positions are one per rank of 4
  s.set_start(9);               // one sample left, padded to 4 from the start
  CHECK(s.indices() == Indices{0});
  s.set_start(10);
  CHECK(s.size() == 0);
  CHECK(s.total_size() == 0);
  CHECK(s.indices().empty());
  s.set_start(0);
  CHECK(s.indices() == DistributedSampler(10, 4, 1, false).indices());
}

TEST_CASE("DistributedSampler::set_start: the trained prefix and the new shards cover the epoch once") {
  // At every mid-epoch checkpoint of a run on R ranks with b samples a step, and for every
  // new world size R2: the samples trained so far are the prefix G[0:C], the new shards
  // interleave into the epoch's order from position C on, and prefix plus shards train
  // every sample once, but for fewer than R2 padding repeats (or, with drop_last, fewer
  // than R2 samples cut, as an uninterrupted epoch cuts its tail).
  int64_t cases = 0;
  for (int64_t n : {1, 2, 5, 10, 11, 31, 64}) {
    Generator gen(42 + 3);
    const Indices perm = randperm(n, DType::Int64, &gen).to_vector<int64_t>();
    for (int64_t replicas : {1, 2, 3, 4}) {
      for (bool drop_last : {false, true}) {
        std::vector<Indices> before;
        for (int64_t r = 0; r < replicas; ++r) {
          DistributedSampler s(n, replicas, r, /*shuffle=*/true, 42, drop_last);
          s.set_epoch(3);
          before.push_back(s.indices());
        }
        const int64_t per_rank = static_cast<int64_t>(before[0].size());
        for (int64_t batch : {1, 3}) {
          for (int64_t steps = 1; steps * batch < per_rank; ++steps) {
            const int64_t consumed = steps * batch * replicas;
            CAPTURE(n);
            CAPTURE(replicas);
            CAPTURE(drop_last);
            CAPTURE(consumed);
            REQUIRE(consumed < n);
            Indices trained;
            for (const Indices& mine : before)
              trained.insert(trained.end(), mine.begin(), mine.begin() + steps * batch);
            std::sort(trained.begin(), trained.end());
            Indices prefix(perm.begin(), perm.begin() + consumed);
            std::sort(prefix.begin(), prefix.end());
            CHECK(trained == prefix);
            for (int64_t replicas2 : {1, 2, 3, 5}) {
              CAPTURE(replicas2);
              const int64_t left = n - consumed;
              const int64_t per_rank2 = torch_num_samples(left, replicas2, drop_last);
              Indices global(per_rank2 * replicas2);
              for (int64_t r = 0; r < replicas2; ++r) {
                DistributedSampler s(n, replicas2, r, true, 42, drop_last);
                s.set_epoch(3);
                s.set_start(consumed);
                Indices mine = s.indices();
                REQUIRE(static_cast<int64_t>(mine.size()) == per_rank2);
                CHECK(s.size() == per_rank2);
                for (int64_t k = 0; k < per_rank2; ++k) global[k * replicas2 + r] = mine[k];
                if (replicas2 == replicas) CHECK(mine == Indices(before[r].begin() + steps * batch, before[r].end()));
              }
              for (size_t j = 0; j < global.size(); ++j) CHECK(global[j] == perm[(consumed + j) % n]);
              std::map<int64_t, int64_t> times;
              for (int64_t i : prefix) times[i]++;
              for (int64_t i : global) times[i]++;
              int64_t repeats = 0;
              for (auto [index, count] : times) repeats += count - 1;
              if (drop_last) {
                CHECK(repeats == 0);
                CHECK(static_cast<int64_t>(times.size()) == n - left % replicas2);
              } else {
                CHECK(static_cast<int64_t>(times.size()) == n);
                CHECK(repeats == per_rank2 * replicas2 - left);
                CHECK(repeats < replicas2);
              }
              ++cases;
            }
          }
        }
      }
    }
  }
  CHECK(cases > 500);
}

TEST_CASE("global_order: the same words for the same order, whatever the replicas") {
  // What a mid-epoch checkpoint's position counts (Sampler::global_order): equal orders say the same.
  CHECK(data::DistributedSampler(10, 3, 1, true, 7).global_order() ==
        data::DistributedSampler(10, 2, 0, true, 7).global_order());
  CHECK(data::DistributedSampler(10, 2, 0, true, 7).global_order() ==
        "DistributedSampler's order of 10 samples, seed 7");
  CHECK(data::DistributedSampler(10, 2, 0, false, 7).global_order() == data::SequentialSampler(10).global_order());
  CHECK(data::RandomSampler(10, 7).global_order() != data::DistributedSampler(10, 1, 0, true, 7).global_order());
  CHECK(data::RandomSampler(10, 7).global_order() != data::RandomSampler(10, 8).global_order());
  CHECK(data::DistributedEvalSampler(10, 2, 0).global_order().empty());  // evaluation runs whole
}

TEST_CASE("DistributedSampler and DistributedEvalSampler: argument errors") {
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 3, 3),
                       Contains("DistributedSampler: invalid rank 3, rank should be in the interval [0, 2]"), Error);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 3, -1), Contains("invalid rank -1"), Error);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 0, 0), Contains("num_replicas must be at least 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(DistributedSampler(-1, 2, 0), Contains("the dataset size must be non-negative"), Error);
  CHECK_THROWS_WITH_AS(DistributedEvalSampler(10, 2, 2), Contains("DistributedEvalSampler: invalid rank 2"), Error);
}

TEST_CASE("DistributedEvalSampler: every sample exactly once, no padding") {
  std::vector<Indices> strided = {{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}};
  std::vector<Indices> contiguous = {{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  for (int64_t r = 0; r < 3; ++r) {
    CHECK(DistributedEvalSampler(10, 3, r).indices() == strided[r]);
    CHECK(DistributedEvalSampler(10, 3, r).size() == static_cast<int64_t>(strided[r].size()));
    CHECK(DistributedEvalSampler(10, 3, r, EvalShard::Contiguous).indices() == contiguous[r]);
    CHECK(DistributedEvalSampler(10, 3, r, EvalShard::Contiguous).size() == static_cast<int64_t>(contiguous[r].size()));
  }
  CHECK(DistributedEvalSampler(2, 4, 3).indices().empty());
  CHECK(DistributedEvalSampler(2, 4, 3, EvalShard::Contiguous).indices().empty());

  for (int64_t n : {0, 1, 3, 10, 17, 64}) {
    for (int64_t replicas : {1, 2, 3, 5, 8}) {
      for (EvalShard shard : {EvalShard::Strided, EvalShard::Contiguous}) {
        for (bool shuffle : {false, true}) {
          std::map<int64_t, int> count;
          int64_t smallest = n, largest = 0;
          for (int64_t r = 0; r < replicas; ++r) {
            DistributedEvalSampler s(n, replicas, r, shard, shuffle, 9);
            s.set_epoch(2);
            Indices mine = s.indices();
            CHECK(static_cast<int64_t>(mine.size()) == s.size());
            smallest = std::min<int64_t>(smallest, mine.size());
            largest = std::max<int64_t>(largest, mine.size());
            for (int64_t i : mine) count[i]++;
          }
          CAPTURE(n);
          CAPTURE(replicas);
          CHECK(static_cast<int64_t>(count.size()) == n);
          for (auto [index, times] : count) {
            CHECK(index >= 0);
            CHECK(index < n);
            CHECK(times == 1);
          }
          CHECK(largest - smallest <= 1);
        }
      }
    }
  }
}
