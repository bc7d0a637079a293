// The CUDA runtime on a GPU: devices and virtual devices, streams and events, the caching
// and direct allocators (reuse, statistics, stream-ordered reuse and frees, the
// out-of-memory message and its relief across logical devices), and
// copies (host <-> device, pinned, across logical devices, dtype conversion, strides),
// and DevicePrefetcher's uploads on a copy stream.
// CTest runs this suite three times: as is, with WEFT_VIRTUAL_DEVICES=4 and with
// WEFT_CUDA_ALLOCATOR=direct.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cuda_test_util.h"
#include "data/dataloader.h"
#include "data/device_prefetcher.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"
#include "kernels/linalg.h"

using namespace weft;
using test::gpu;

namespace {

int virtual_devices() {
  const char* v = std::getenv("WEFT_VIRTUAL_DEVICES");
  return v && *v ? std::atoi(v) : 0;
}

// CTest runs this suite again with WEFT_CUDA_ALLOCATOR=direct (no cache, exact blocks).
bool direct_allocator() {
  return cuda::allocator_kind(std::getenv("WEFT_CUDA_ALLOCATOR")) == cuda::AllocatorKind::Direct;
}

// Holds a stream busy until release(): a host function queued on it spins on a flag.
struct StreamBlocker {
  std::atomic<bool> released{false};
  explicit StreamBlocker(const Stream& stream) {
    WEFT_CUDA_CHECK(cudaLaunchHostFunc(
        cuda::native(stream),
        [](void* self) {
          while (!static_cast<StreamBlocker*>(self)->released.load()) {
          }
        },
        this));
  }
  void release() { released.store(true); }
};

// Queues about 10 ms of matrix products on `stream`.
void keep_busy(const Stream& stream) {
  StreamGuard guard(stream);
  Tensor a = full({4096, 4096}, 1.0 / 4096, TensorOptions(DType::Float32, stream.device()));
  for (int i = 0; i < 4; ++i) a = matmul(a, a);
}

}  // namespace

TEST_CASE("logical devices map onto the physical GPUs") {
  int physical = cuda::physical_device_count();
  REQUIRE(physical >= 1);
  int logical = cuda::device_count();
  CHECK(logical == (virtual_devices() ? virtual_devices() : physical));
  for (int i = 0; i < logical; ++i) CHECK(cuda::physical_device(gpu(i)) == i % physical);
  CHECK_THROWS_WITH_AS(zeros({1}, TensorOptions(DType::Float32, gpu(logical))),
                       doctest::Contains("logical CUDA device(s)"), Error);
  CHECK_THROWS_WITH_AS(zeros({1}, TensorOptions(DType::Float32, gpu(logical))),
                       doctest::Contains("WEFT_VIRTUAL_DEVICES"), Error);
}

TEST_CASE("each logical device has its own compute stream; StreamGuard switches and restores") {
  Stream s0 = default_stream(gpu(0));
  CHECK(current_stream(gpu(0)) == s0);
  CHECK(default_stream(gpu(0)) == s0);
  if (cuda::device_count() >= 2) CHECK_FALSE(default_stream(gpu(1)) == s0);
  Stream side = new_stream(gpu(0));
  Tensor a = test::random({1000}, DType::Float32, 3);
  Tensor expected = add(a, a);
  Tensor result;
  {
    StreamGuard guard(side);
    CHECK(current_stream(gpu(0)) == side);
    Tensor x = a.to(gpu());
    result = add(x, x);
    Event done;
    done.record(side);
    done.block(s0);
  }
  CHECK(current_stream(gpu(0)) == s0);
  CHECK_GPU_MATCHES(result, expected, 0, 0);
}

TEST_CASE("events time work and report completion") {
  Stream s = current_stream(gpu());
  Event start(true), stop(true);
  start.record(s);
  Tensor x = ones({1 << 20}, TensorOptions(DType::Float32, gpu()));
  Tensor y = mul(x, 3.0);
  stop.record(s);
  stop.synchronize();
  CHECK(stop.query());
  CHECK(start.elapsed_ms(stop) >= 0.0f);
  CHECK(y.to(kCPU).to_vector<float>()[12345] == 3.0f);
}

TEST_CASE("the caching allocator reuses blocks and counts bytes like the CPU allocator") {
  if (direct_allocator()) {
    MESSAGE("WEFT_CUDA_ALLOCATOR=direct: nothing is cached (see the direct allocator's case)");
    return;
  }
  Device d = gpu();
  cuda::synchronize(d);
  AllocatorStats before = memory_stats(d);
  // 12 MiB: a segment of its own, so the freed block is not merged with neighbours.
  const int64_t n = 3 << 20;
  void* first = nullptr;
  {
    Tensor t = empty({n}, TensorOptions(DType::Float32, d));
    first = t.raw_data();
    AllocatorStats during = memory_stats(d);
    CHECK(during.bytes_in_use == before.bytes_in_use + 4 * n);
    CHECK(during.num_allocations == before.num_allocations + 1);
    CHECK(during.bytes_reserved >= during.bytes_in_use);
  }
  CHECK(memory_stats(d).bytes_in_use == before.bytes_in_use);
  Tensor again = empty({n}, TensorOptions(DType::Float32, d));
  CHECK(again.raw_data() == first);  // same stream, same size class: the cached block
  reset_peak_memory_stats(d);
  CHECK(memory_stats(d).peak_bytes_in_use == memory_stats(d).bytes_in_use);
}

TEST_CASE("empty_cache gives whole free segments back") {
  if (direct_allocator()) {
    MESSAGE("WEFT_CUDA_ALLOCATOR=direct: nothing is cached");
    return;
  }
  Device d = gpu();
  { Tensor big = empty({64 << 20}, TensorOptions(DType::Float32, d)); }
  int64_t reserved = memory_stats(d).bytes_reserved;
  cuda::empty_cache(d);
  CHECK(memory_stats(d).bytes_reserved <= reserved - (int64_t{256} << 20));
}

TEST_CASE("out of memory says what was asked for, what is used and what is cached") {
  Device d = gpu();
  Shape huge{int64_t{1} << 48};  // 1 PiB of float32
  CHECK_THROWS_WITH_AS(empty(huge, TensorOptions(DType::Float32, d)),
                       doctest::Contains("CUDA out of memory on cuda:0: tried to allocate 1024.00 TiB ("), Error);
  CHECK_THROWS_WITH_AS(empty(huge, TensorOptions(DType::Float32, d)), doctest::Contains("in use by tensors"), Error);
  CHECK_THROWS_WITH_AS(empty(huge, TensorOptions(DType::Float32, d)), doctest::Contains("GiB free"), Error);
  Tensor fine = ones({10}, TensorOptions(DType::Float32, d));  // the allocator still works
  CHECK(fine.to(kCPU).to_vector<float>()[9] == 1.0f);
}

TEST_CASE("record_stream: a block read by another stream is not reused until that stream is done") {
  if (direct_allocator()) {
    // Its free would wait for the blocked stream, which the test releases only later.
    MESSAGE("WEFT_CUDA_ALLOCATOR=direct: frees wait for the streams instead (see the direct allocator's case)");
    return;
  }
  Device d = gpu();
  Stream side = new_stream(d);
  void* block = nullptr;
  StreamBlocker blocker(side);
  const int64_t n = 3 << 20;  // 12 MiB: a segment of its own (see the test above)
  {
    Tensor t = empty({n}, TensorOptions(DType::Float32, d));
    block = t.raw_data();
    record_stream(t, side);
  }
  Tensor other = empty({n}, TensorOptions(DType::Float32, d));
  CHECK(other.raw_data() != block);
  blocker.release();
  side.synchronize();
  Tensor reused = empty({n}, TensorOptions(DType::Float32, d));
  CHECK(reused.raw_data() == block);
}

TEST_CASE("WEFT_CUDA_ALLOCATOR=direct: one exact allocation per tensor, freed once its streams are done") {
  if (!direct_allocator()) {
    MESSAGE("the caching allocator is in use: run with WEFT_CUDA_ALLOCATOR=direct (CTest's _direct entries)");
    return;
  }
  Device d = gpu();
  cuda::synchronize(d);
  const AllocatorStats before = memory_stats(d);
  CHECK(before.bytes_reserved == before.bytes_in_use);
  {
    Tensor t = empty({1001}, TensorOptions(DType::UInt8, d));  // not rounded to anything
    CHECK(memory_stats(d).bytes_in_use == before.bytes_in_use + 1001);
    CHECK(memory_stats(d).bytes_reserved == before.bytes_reserved + 1001);
    CHECK(cuda::device_allocator(d).cached_bytes() == 0);
  }
  CHECK(memory_stats(d).bytes_reserved == before.bytes_reserved);
  // A block read by another stream is freed only after that stream's work: the values
  // it reads are still the ones written (memcheck would report a use after free).
  Stream side = new_stream(d);
  Tensor x = full({1 << 20}, 2.0, TensorOptions(DType::Float32, d));
  Tensor doubled;
  {
    Tensor y = mul(x, 1.0);
    Event written;
    written.record(current_stream(d));
    written.block(side);
    keep_busy(side);
    StreamGuard guard(side);
    doubled = mul(y, 2.0);
    record_stream(y, side);
  }
  CHECK(doubled.to(kCPU).to_vector<float>()[12345] == 4.0f);
}

TEST_CASE("out of memory on one logical device empties the caches of the others on its GPU") {
  if (cuda::device_count() < 2 || cuda::physical_device(gpu(0)) != cuda::physical_device(gpu(1))) {
    MESSAGE("needs two logical devices on one GPU: run with WEFT_VIRTUAL_DEVICES=4");
    return;
  }
  { Tensor cached = empty({16 << 20}, TensorOptions(DType::Float32, gpu(1))); }  // 64 MiB left in cuda:1's cache
  const int64_t reserved = memory_stats(gpu(1)).bytes_reserved;
  Shape huge{int64_t{1} << 48};
  CHECK_THROWS_WITH_AS(empty(huge, TensorOptions(DType::Float32, gpu(0))),
                       doctest::Contains("and emptying the caches of cuda:0"), Error);
  if (!direct_allocator()) CHECK(memory_stats(gpu(1)).bytes_reserved <= reserved - (int64_t{64} << 20));
  CHECK_THROWS_WITH_AS(empty(huge, TensorOptions(DType::Float32, gpu(0))),
                       doctest::Contains("cuda:1 on the same GPU holds"), Error);
}

TEST_CASE("host <-> device copies for every dtype, strides and conversions") {
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool}) {
    CAPTURE(dtype);
    Tensor host = test::random({37, 5}, DType::Float64, 11, -50, 50).to(dtype);
    Tensor back = host.to(gpu()).to(kCPU);
    CHECK_CLOSE(back.to(DType::Float64), host.to(DType::Float64), 0, 0);
    Tensor strided = test::noncontiguous(host);
    CHECK_CLOSE(strided.to(gpu()).to(kCPU).to(DType::Float64), host.to(DType::Float64), 0, 0);
  }
  // Conversion and a transposed destination on the device.
  Tensor src = test::random({9, 13}, DType::Float64, 12);
  Tensor dst = test::poisoned({13, 9}, DType::Float32, gpu()).transpose(0, 1);
  dst.copy_(src.to(gpu()));
  CHECK_GPU_MATCHES(dst, src.to(DType::Float32), 0, 0);
  // Broadcasting copy_ and fill on a strided view.
  Tensor row = test::random({1, 13}, DType::Float32, 13);
  Tensor wide = test::poisoned({9, 13}, DType::Float32, gpu());
  wide.copy_(row.to(gpu()));
  CHECK_GPU_MATCHES(wide, row.expand({9, 13}), 0, 0);
  Tensor filled = test::poisoned({6, 8}, DType::Float64, gpu());
  fill_(filled.slice(1, 0, 8, 2), 2.5);
  auto values = filled.to(kCPU).to_vector<double>();
  for (int i = 0; i < 48; ++i) CHECK((i % 2 == 0 ? values[i] == 2.5 : std::isnan(values[i])));
  CHECK_GPU_MATCHES(zeros({0, 3}, TensorOptions(DType::Float32, gpu())), zeros({0, 3}), 0, 0);
}

TEST_CASE("float16 and bfloat16 conversions on the GPU give the CPU's bits") {
  // Every 16-bit pattern (NaNs, infinities, subnormals) widened on the GPU, and doubles and
  // floats rounded on the GPU (random ones, and the ties and near-ties of test_half), strided.
  std::vector<double> probes;
  Tensor random = test::random({4096}, DType::Float64, 41);
  for (double v : random.to_vector<double>())
    for (int e : {-30, -14, 0, 8, 15, 16, 120, 128}) probes.push_back(std::ldexp(v, e));
  for (double tie : {1.0 + 0x1p-11, 65520.0, 0x1p-25, 1.0 + 0x1p-8, 0x1p-133})
    for (double v : {tie, std::nextafter(tie, 0.0), std::nextafter(tie, INFINITY)}) probes.push_back(v);
  Tensor doubles = tensor(probes);
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    CAPTURE(dtype);
    Tensor every = empty({65536}, dtype);
    auto* bits = static_cast<uint16_t*>(every.raw_data());
    for (int b = 0; b < 65536; ++b) bits[b] = static_cast<uint16_t>(b);
    for (DType wide : {DType::Float32, DType::Float64}) {
      Tensor on_gpu = every.to(gpu()).to(wide).to(kCPU), on_cpu = every.to(wide);
      CHECK(std::memcmp(on_gpu.raw_data(), on_cpu.raw_data(), static_cast<size_t>(on_cpu.nbytes())) == 0);
    }
    for (const Tensor& source : {doubles, doubles.to(DType::Float32)}) {
      const int64_t n = static_cast<int64_t>(probes.size());
      Tensor on_gpu = test::poisoned({2 * n}, dtype, gpu()).slice(0, 0, 2 * n, 2);
      on_gpu.copy_(source.to(gpu()));
      Tensor on_cpu = source.to(dtype);
      CHECK(std::memcmp(on_gpu.contiguous().to(kCPU).raw_data(), on_cpu.raw_data(),
                        static_cast<size_t>(on_cpu.nbytes())) == 0);
    }
    Tensor filled = full({3}, 1.0 / 3, TensorOptions(dtype, gpu())).to(kCPU);
    CHECK(std::memcmp(filled.raw_data(), full({3}, 1.0 / 3, dtype).raw_data(), 6) == 0);
  }
}

TEST_CASE("pinned host memory: asynchronous uploads, cached blocks") {
  Tensor host = test::random({1 << 16}, DType::Float32, 21);
  Tensor pinned = host.pin_memory();
  CHECK(pinned.is_pinned());
  CHECK_FALSE(host.is_pinned());
  CHECK(pinned.pin_memory().is_same(pinned));
  CHECK_CLOSE(pinned, host, 0, 0);
  Tensor on_device = pinned.to(gpu());
  CHECK_GPU_MATCHES(on_device, host, 0, 0);
  CHECK_THROWS_WITH_AS(on_device.pin_memory(), doctest::Contains("only host tensors can be pinned"), Error);
}

TEST_CASE("DevicePrefetcher: pinned batches uploaded on the upload stream, seen whole by the compute stream") {
  auto ds = std::make_shared<data::TensorDataset>(test::random({64, 3, 5}, DType::Float32, 31), arange(64));
  data::DataLoader loader(ds, {.batch_size = 8, .shuffle = true, .num_workers = 2, .pin_memory = true, .seed = 3});
  std::vector<data::Batch> expected;
  for (data::Batch& b : loader) expected.push_back(b);
  REQUIRE(expected.size() == 8);
  CHECK(expected[0].data.is_pinned());
  const Stream compute = current_stream(gpu()), upload = upload_stream(gpu());
  CHECK_FALSE(compute == upload);
  data::DevicePrefetcher prefetcher(loader, gpu());
  auto it = prefetcher.begin();  // batch 0 handed out, batch 1 uploading
  CHECK(it->data.device() == gpu());
  // The event: batch 2's upload queues behind slow work on the upload stream and is
  // handed out at once; what the compute stream reads must still be batch 2, whole.
  keep_busy(upload);
  ++it;
  ++it;
  CHECK_GPU_MATCHES(mul(it->data, 2.0), mul(expected[2].data, 2.0), 0, 0);
  // record_stream: reads of batch k queue behind slow work on the compute stream while ++
  // drops batch k and uploads batch k + 2 at once; that upload must not take k's memory.
  for (size_t k = 2; k < expected.size(); ++k) {
    CAPTURE(k);
    REQUIRE(it != prefetcher.end());
    keep_busy(compute);
    Tensor doubled = mul(it->data, 2.0), targets = it->target.clone();
    ++it;
    CHECK_GPU_MATCHES(doubled, mul(expected[k].data, 2.0), 0, 0);
    CHECK_GPU_MATCHES(targets, expected[k].target, 0, 0);
  }
  CHECK(it == prefetcher.end());
}

TEST_CASE("copies across logical devices") {
  if (cuda::device_count() < 2) {
    MESSAGE("one logical device: run with WEFT_VIRTUAL_DEVICES=4 to cover cross-device copies");
    return;
  }
  Tensor host = test::random({31, 17}, DType::Float64, 31);
  Tensor a = host.to(gpu(0));
  AllocatorStats before = memory_stats(gpu(1));
  Tensor b = a.to(gpu(1));
  CHECK(b.device() == gpu(1));
  CHECK(memory_stats(gpu(1)).bytes_in_use == before.bytes_in_use + 31 * 17 * 8);
  CHECK_GPU_MATCHES(b, host, 0, 0);
  Tensor t = test::poisoned({17, 31}, DType::Float32, gpu(1)).transpose(0, 1);
  t.copy_(test::noncontiguous(host).to(gpu(0)));
  CHECK_GPU_MATCHES(t, host.to(DType::Float32), 0, 0);
  CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("cuda:0"), Error);
  CHECK_THROWS_WITH_AS(add(a, host), doctest::Contains("cpu:0"), Error);
}

TEST_CASE("autograd crosses devices") {
  Tensor x = test::leaf({4, 3}, 41);
  Tensor y = mul(x.to(gpu()), 3.0);
  sum(y).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == kCPU);
  CHECK_CLOSE(x.grad(), full({4, 3}, 3.0, TensorOptions(DType::Float64, kCPU)), 0, 0);
}
