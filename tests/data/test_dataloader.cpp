// weft::data::DataLoader: batch order and contents, equality across num_workers, seeded
// shuffles, the bounded prefetch queue, worker exceptions and early destruction;
// DevicePrefetcher on the CPU (on a GPU: test_cuda_runtime).
#include "test_util.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "data/dataloader.h"
#include "data/device_prefetcher.h"

using namespace weft;
using namespace weft::data;
using doctest::Contains;

namespace {

using Indices = std::vector<int64_t>;

// Random rows, target = row index.
std::shared_ptr<TensorDataset> rows(int64_t n, uint64_t seed = 1) {
  return std::make_shared<TensorDataset>(test::random({n, 3}, DType::Float32, seed), arange(n));
}

// Adds noise drawn from batch_generator(): the augmentation case of Note [Loader determinism].
class NoisyDataset : public TensorDataset {
 public:
  NoisyDataset(int64_t n) : TensorDataset(test::random({n, 3}, DType::Float32, 2), arange(n)) {}
  Batch get_batch(const Indices& indices) const override {
    Batch b = TensorDataset::get_batch(indices);
    b.data = add(b.data, rand(b.data.shape(), DType::Float32, &batch_generator()));
    return b;
  }
};

// Throws for one index; optionally sleeps per batch and counts the batches it loaded.
class TroubleDataset : public TensorDataset {
 public:
  TroubleDataset(int64_t n, int64_t bad, bool std_error = false, int sleep_ms = 0)
      : TensorDataset(zeros({n, 2}), arange(n)), bad_(bad), std_error_(std_error), sleep_ms_(sleep_ms) {}
  Batch get_batch(const Indices& indices) const override {
    loaded_++;
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    for (int64_t i : indices) {
      if (i != bad_) continue;
      if (std_error_) throw std::runtime_error("plain failure at " + std::to_string(i));
      WEFT_FAIL("bad sample ", i);
    }
    return TensorDataset::get_batch(indices);
  }
  int64_t loaded() const { return loaded_; }

 private:
  int64_t bad_;
  bool std_error_;
  int sleep_ms_;
  mutable std::atomic<int64_t> loaded_{0};
};

std::vector<Batch> collect(DataLoader& loader) {
  std::vector<Batch> out;
  for (Batch& b : loader) out.push_back(b);
  return out;
}

Indices targets_of(const std::vector<Batch>& batches) {
  Indices out;
  for (const Batch& b : batches) {
    auto t = b.target.to_vector<int64_t>();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

void check_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].data.shape() == b[k].data.shape());
    CHECK(a[k].data.to_vector<float>() == b[k].data.to_vector<float>());
    CHECK(a[k].target.to_vector<int64_t>() == b[k].target.to_vector<int64_t>());
  }
}

}  // namespace

TEST_CASE("batches in sampler order, sizes, drop_last") {
  auto ds = rows(23);
  DataLoader loader(ds, {.batch_size = 4});
  CHECK(loader.size() == 6);
  auto batches = collect(loader);
  REQUIRE(batches.size() == 6);
  CHECK(batches[0].data.shape() == Shape{4, 3});
  CHECK(batches[0].target.dtype() == DType::Int64);
  CHECK(batches[5].data.shape() == Shape{3, 3});
  CHECK(targets_of(batches) == SequentialSampler(23).indices());
  CHECK(batches[2].data.to_vector<float>() == ds->data().narrow(0, 8, 4).to_vector<float>());

  DataLoader dropping(ds, {.batch_size = 4, .drop_last = true});
  CHECK(dropping.size() == 5);
  auto kept = collect(dropping);
  CHECK(kept.size() == 5);
  CHECK(kept.back().data.shape() == Shape{4, 3});

  DataLoader defaults(ds);
  CHECK(defaults.size() == 23);
  CHECK(collect(defaults)[7].target.to_vector<int64_t>() == Indices{7});

  DataLoader empty(rows(0));
  CHECK(empty.size() == 0);
  CHECK(empty.begin() == empty.end());
}

TEST_CASE("the same batches for num_workers 0, 1, 3 (shuffled, with per-batch randomness)") {
  auto ds = std::make_shared<NoisyDataset>(37);
  std::vector<std::vector<Batch>> runs;
  for (int64_t workers : {0, 1, 3}) {
    for (int64_t prefetch : {1, 2}) {
      DataLoader loader(ds, {.batch_size = 5, .shuffle = true, .num_workers = workers, .prefetch_factor = prefetch,
                             .seed = 11});
      loader.set_epoch(2);
      runs.push_back(collect(loader));
    }
  }
  for (size_t k = 1; k < runs.size(); ++k) check_same_batches(runs[0], runs[k]);
  // The noise is really there.
  Batch clean = ds->TensorDataset::get_batch(runs[0][0].target.to_vector<int64_t>());
  CHECK(runs[0][0].data.to_vector<float>() != clean.data.to_vector<float>());
}

TEST_CASE("set_start: a resumed pass loads the uninterrupted pass's batches, per-batch randomness included") {
  auto ds = std::make_shared<NoisyDataset>(37);
  for (int64_t workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader whole(ds, {.batch_size = 5, .shuffle = true, .num_workers = workers, .seed = 11});
    whole.set_epoch(1);
    const std::vector<Batch> all = collect(whole);
    DataLoader rest(ds, {.batch_size = 5, .shuffle = true, .num_workers = workers, .seed = 11});
    rest.set_epoch(1);
    rest.set_start(15);
    CHECK(rest.start() == 15);
    CHECK(rest.first_batch() == 3);
    CHECK(rest.size() == 5);
    check_same_batches(collect(rest), std::vector<Batch>(all.begin() + 3, all.end()));
    rest.set_start(0);
    check_same_batches(collect(rest), all);
  }
  // Through a DistributedSampler the batches are numbered by this rank's positions: 2 steps
  // of 3 samples on 2 ranks consumed 12, and rank 1 goes on at its batch 2.
  auto sampler = std::make_shared<DistributedSampler>(37, 2, 1, true, 4);
  DataLoader whole(ds, {.batch_size = 3}, sampler);
  const std::vector<Batch> all = collect(whole);
  whole.set_start(12);
  CHECK(whole.first_batch() == 2);
  check_same_batches(collect(whole), std::vector<Batch>(all.begin() + 2, all.end()));
}

TEST_CASE("shuffle: reproducible by seed, different across epochs, each epoch a permutation") {
  auto ds = rows(30);
  auto order = [&](uint64_t seed, int64_t epoch, int64_t workers) {
    DataLoader loader(ds, {.batch_size = 7, .shuffle = true, .num_workers = workers, .seed = seed});
    loader.set_epoch(epoch);
    return targets_of(collect(loader));
  };
  Indices e0 = order(5, 0, 0);
  CHECK(e0 == order(5, 0, 2));
  CHECK(e0 != order(6, 0, 0));
  Indices e1 = order(5, 1, 0);
  CHECK(e0 != e1);
  RandomSampler sampler(30, 5);
  sampler.set_epoch(1);
  CHECK(e1 == sampler.indices());
  std::sort(e1.begin(), e1.end());
  CHECK(e1 == SequentialSampler(30).indices());

  // Without set_epoch a second pass repeats the first (see sampler.h).
  DataLoader loader(ds, {.batch_size = 7, .shuffle = true, .seed = 5});
  CHECK(targets_of(collect(loader)) == targets_of(collect(loader)));
}

TEST_CASE("a custom sampler: DistributedSampler through the loader, set_epoch reaches it") {
  auto ds = rows(10);
  auto sampler = std::make_shared<DistributedSampler>(10, 3, 1, true, 4);
  DataLoader loader(ds, {.batch_size = 3, .num_workers = 2}, sampler);
  CHECK(loader.size() == 2);  // 4 samples on this rank
  loader.set_epoch(2);
  CHECK(sampler->epoch() == 2);
  CHECK(&loader.sampler() == sampler.get());
  CHECK(loader.dataset() == ds);
  CHECK(targets_of(collect(loader)) == sampler->indices());
}

TEST_CASE("argument errors") {
  auto ds = rows(4);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.shuffle = true}, std::make_shared<SequentialSampler>(4)),
                       Contains("shuffle=true cannot be combined with a custom sampler"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.batch_size = 0}), Contains("DataLoader: batch_size must be at least 1, got 0"),
                       Error);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.num_workers = -1}), Contains("num_workers must be non-negative, got -1"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.num_workers = 2, .prefetch_factor = 0}),
                       Contains("prefetch_factor must be at least 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(nullptr), Contains("DataLoader: the dataset is null"), Error);
  // A sampler that reaches past the dataset: the dataset's range error, at that batch.
  DataLoader too_far(ds, {.batch_size = 2}, std::make_shared<SequentialSampler>(6));
  auto it = too_far.begin();
  ++it;
  CHECK_THROWS_WITH_AS(++it, Contains("index 4 is out of range for a dataset of 4 samples"), Error);
}

TEST_CASE("an exception in a worker is rethrown at its batch, with its message and type") {
  for (int64_t workers : {0, 1, 3}) {
    CAPTURE(workers);
    auto ds = std::make_shared<TroubleDataset>(12, 7);
    DataLoader loader(ds, {.batch_size = 2, .num_workers = workers});
    int64_t delivered = 0;
    auto run = [&] {
      for (Batch& b : loader) {
        CHECK(b.target.to_vector<int64_t>()[0] == 2 * delivered);
        ++delivered;
      }
    };
    CHECK_THROWS_WITH_AS(run(), Contains("bad sample 7"), Error);
    CHECK(delivered == 3);  // batches 0, 1, 2; batch 3 holds sample 7

    // The pass goes on after the failed batch.
    auto it = loader.begin();
    ++it;
    ++it;
    CHECK_THROWS_WITH_AS(++it, Contains("bad sample 7"), Error);
    ++it;
    CHECK(it->target.to_vector<int64_t>() == Indices{8, 9});
    ++it;
    ++it;
    CHECK(it == loader.end());

    DataLoader plain(std::make_shared<TroubleDataset>(12, 0, true), {.batch_size = 2, .num_workers = workers});
    CHECK_THROWS_WITH_AS(plain.begin(), Contains("plain failure at 0"), std::runtime_error);
  }
}

TEST_CASE("workers load at most num_workers * prefetch_factor batches ahead") {
  auto ds = std::make_shared<TroubleDataset>(100, -1);
  DataLoader loader(ds, {.batch_size = 2, .num_workers = 2, .prefetch_factor = 2});
  auto it = loader.begin();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Batch 0 is delivered; batches 1 to 4 may be loaded or waiting, no more.
  CHECK(ds->loaded() == 5);
  ++it;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(ds->loaded() == 6);
}

TEST_CASE("destroying a loader mid-epoch stops its workers promptly; a new pass ends the old one") {
  auto ds = std::make_shared<TroubleDataset>(2000, -1, false, 20);
  std::promise<double> seconds;
  auto done = seconds.get_future();
  std::thread consumer([&] {
    auto loader = std::make_unique<DataLoader>(ds, DataLoaderOptions{.batch_size = 2, .num_workers = 3});
    auto it = loader->begin();
    ++it;
    auto start = std::chrono::steady_clock::now();
    loader.reset();
    seconds.set_value(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    consumer.detach();
    FAIL("the loader's destructor did not return within 10 s");
  }
  consumer.join();
  CHECK(done.get() < 1.0);  // each worker finishes at most the one 20 ms batch it holds
  CHECK(ds->loaded() < 20);

  DataLoader loader(rows(20), {.batch_size = 2, .num_workers = 2});
  auto old = loader.begin();
  auto fresh = loader.begin();
  CHECK_THROWS_WITH_AS(++old, Contains("this pass has ended"), Error);
  CHECK(fresh->target.to_vector<int64_t>() == Indices{0, 1});
}

TEST_CASE("pin_memory is accepted and changes nothing without CUDA") {
  auto ds = rows(9);
  DataLoader pinned(ds, {.batch_size = 4, .num_workers = 1, .pin_memory = true});
  DataLoader plain(ds, {.batch_size = 4});
  check_same_batches(collect(pinned), collect(plain));
  CHECK(&batch_generator() == &default_generator());  // outside a loader
}

TEST_CASE("DevicePrefetcher: the loader's batches, in order, on the device; every pass anew") {
  for (int64_t workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(rows(23), {.batch_size = 4, .shuffle = true, .num_workers = workers, .seed = 5});
    loader.set_epoch(1);
    const std::vector<Batch> expected = collect(loader);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<Batch> got;
      for (const Batch& b : DevicePrefetcher(loader, Device::cpu())) {
        CHECK(b.data.device() == Device::cpu());
        got.push_back(b);
      }
      CHECK(got.size() == 6);  // 5 full batches and one of 3
      check_same_batches(got, expected);
    }
  }
  DataLoader single(rows(3), {.batch_size = 4});
  CHECK(collect(single).size() == 1);
  int64_t count = 0;
  for (const Batch& b : DevicePrefetcher(single, Device::cpu())) count += b.target.size(0);
  CHECK(count == 3);
  DataLoader none(rows(3), {.batch_size = 4, .drop_last = true});
  DevicePrefetcher empty(none, Device::cpu());
  CHECK(empty.begin() == empty.end());
}

TEST_CASE("DevicePrefetcher: a failed batch is raised where it would be handed out, and the pass goes on") {
  for (int64_t workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(std::make_shared<TroubleDataset>(12, 7), {.batch_size = 2, .num_workers = workers});
    DevicePrefetcher prefetcher(loader, Device::cpu());
    auto it = prefetcher.begin();
    for (int64_t k = 0; k < 3; ++k) {
      CHECK(it->target.to_vector<int64_t>() == Indices{2 * k, 2 * k + 1});
      if (k < 2) ++it;
    }
    // Batch 3 holds sample 7: its error comes at the ++ that would hand it out, and the
    // iterator stays on batch 2.
    CHECK_THROWS_WITH_AS(++it, Contains("bad sample 7"), Error);
    CHECK(it->target.to_vector<int64_t>() == Indices{4, 5});
    ++it;
    CHECK(it->target.to_vector<int64_t>() == Indices{8, 9});
    ++it;
    CHECK(it->target.to_vector<int64_t>() == Indices{10, 11});
    ++it;
    CHECK(it == prefetcher.end());
    CHECK_THROWS_WITH_AS(++it, Contains("past the last batch"), Error);
    CHECK_THROWS_WITH_AS(*it, Contains("past the last batch"), Error);
  }
  // The first batch's error comes from begin(), as the loader's does.
  DataLoader first(std::make_shared<TroubleDataset>(12, 0), {.batch_size = 2});
  DevicePrefetcher failing(first, Device::cpu());
  CHECK_THROWS_WITH_AS(failing.begin(), Contains("bad sample 0"), Error);
}
