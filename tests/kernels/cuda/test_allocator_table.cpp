// Out of memory across logical devices that share a GPU (Note [Out of memory on a shared
// GPU] in kernels/cuda/allocator_table.h), on fake devices that share a capacity
// (fake_device_memory.h): runs on every machine.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "core/error.h"
#include "fake_device_memory.h"
#include "kernels/cuda/allocator_table.h"
#include "kernels/cuda/caching_allocator.h"
#include "kernels/cuda/direct_allocator.h"

using weft::Device;
using weft::cuda::AllocatorTable;
using weft::cuda::CachingAllocator;
using weft::cuda::DeviceAllocator;
using weft::test::FakeDevice;
using weft::test::FakeState;
using weft::test::MiB;

namespace {

// Logical devices on fake GPUs: cuda:i runs on GPU gpu_of[i], whose state is gpus[gpu_of[i]].
struct FakeMachine {
  std::vector<FakeState> gpus;
  std::vector<int> gpu_of;
  AllocatorTable table;

  FakeMachine(int gpu_count, std::vector<int> plan, size_t capacity, bool direct = false)
      : gpus(static_cast<size_t>(gpu_count)), gpu_of(std::move(plan)),
        table(
            [this, direct](Device d) -> std::unique_ptr<DeviceAllocator> {
              const int gpu = gpu_of.at(static_cast<size_t>(d.index));
              auto memory = std::make_unique<FakeDevice>(gpus[static_cast<size_t>(gpu)],
                                                         "fake GPU " + std::to_string(gpu));
              if (direct) return std::make_unique<weft::cuda::DirectAllocator>(d, std::move(memory));
              return std::make_unique<CachingAllocator>(d, std::move(memory));
            },
            [this](Device d) {
              WEFT_CHECK(d.is_cuda() && d.index < static_cast<int>(gpu_of.size()), "no such device ", d);
              return gpu_of[static_cast<size_t>(d.index)];
            }) {
    for (FakeState& s : gpus) s.capacity = capacity;
  }
};

}  // namespace

TEST_CASE("the table makes one allocator per logical device, on first use") {
  FakeMachine m(1, {0, 0}, 64 * MiB);
  DeviceAllocator& a = m.table.get(Device::cuda(0));
  CHECK(&m.table.get(Device::cuda(0)) == &a);
  CHECK(&m.table.get(Device::cuda(1)) != &a);
  CHECK(m.table.get(Device::cuda(1)).device() == Device::cuda(1));
  CHECK_THROWS_WITH_AS(m.table.get(Device::cuda(2)), doctest::Contains("no such device cuda:2"), weft::Error);
}

TEST_CASE("out of memory on one logical device empties the caches of its siblings on the same GPU") {
  FakeMachine m(1, {0, 0}, 30 * MiB);
  DeviceAllocator& first = m.table.get(Device::cuda(0));
  DeviceAllocator& second = m.table.get(Device::cuda(1));
  void* p = first.allocate(20 * MiB);
  first.deallocate(p, 20 * MiB);
  CHECK(first.cached_bytes() == static_cast<int64_t>(20 * MiB));
  // cuda:1 cannot have 20 MiB while cuda:0 caches 20 of the GPU's 30: it frees cuda:0's cache.
  void* q = second.allocate(20 * MiB);
  CHECK(q != nullptr);
  CHECK(first.cached_bytes() == 0);
  CHECK(first.stats().bytes_reserved == 0);
  CHECK(m.gpus[0].used == 20 * MiB);
  CHECK(m.gpus[0].device_synchronizations >= 1);
  second.deallocate(q, 20 * MiB);
}

TEST_CASE("the relief waits for a sibling's blocks that other streams still use") {
  FakeMachine m(1, {0, 0, 0}, 30 * MiB);
  DeviceAllocator& first = m.table.get(Device::cuda(0));
  DeviceAllocator& third = m.table.get(Device::cuda(2));
  void* p = first.allocate(20 * MiB);
  first.record_stream(p, 42);
  m.gpus[0].busy.insert(42);
  first.deallocate(p, 20 * MiB);  // waits for stream 42: not even empty_cache could give it back
  first.empty_cache();
  CHECK(m.gpus[0].used == 20 * MiB);
  void* q = third.allocate(16 * MiB);  // the GPU is synchronised, then cuda:0's block is free to go
  CHECK(q != nullptr);
  CHECK(m.gpus[0].busy.empty());
  CHECK(m.gpus[0].used == 16 * MiB);
  third.deallocate(q, 16 * MiB);
}

TEST_CASE("out of memory leaves the caches of logical devices on other GPUs alone") {
  FakeMachine m(2, {0, 1}, 30 * MiB);
  DeviceAllocator& on_gpu0 = m.table.get(Device::cuda(0));
  DeviceAllocator& on_gpu1 = m.table.get(Device::cuda(1));
  void* p = on_gpu0.allocate(20 * MiB);
  on_gpu0.deallocate(p, 20 * MiB);
  void* held = on_gpu1.allocate(20 * MiB);
  CHECK_THROWS_WITH_AS(on_gpu1.allocate(20 * MiB),
                       doctest::Contains("after synchronising GPU 1 and emptying the cache of cuda:1 (0 bytes given "
                                         "back)"),
                       weft::Error);
  CHECK(on_gpu0.cached_bytes() == static_cast<int64_t>(20 * MiB));  // another GPU's memory would not help
  CHECK(m.gpus[0].device_synchronizations == 0);
  on_gpu1.deallocate(held, 20 * MiB);
}

TEST_CASE("when even the siblings' caches are not enough, the error says what each logical device holds") {
  FakeMachine m(1, {0, 0, 0}, 40 * MiB);
  DeviceAllocator& a0 = m.table.get(Device::cuda(0));
  DeviceAllocator& a1 = m.table.get(Device::cuda(1));
  DeviceAllocator& a2 = m.table.get(Device::cuda(2));
  void* used0 = a0.allocate(14 * MiB);
  void* cached2 = a2.allocate(12 * MiB);
  a2.deallocate(cached2, 12 * MiB);
  void* used1 = a1.allocate(12 * MiB);
  std::string message;
  try {
    a1.allocate(20 * MiB);
  } catch (const weft::Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("CUDA out of memory on cuda:1: tried to allocate 20.00 MiB") != std::string::npos);
  CHECK(message.find("after synchronising GPU 0 and emptying the caches of cuda:0, cuda:1 and cuda:2 (12.00 MiB "
                     "given back)") != std::string::npos);
  CHECK(message.find("cuda:0 on the same GPU holds 14.00 MiB in use by tensors and 0 bytes cached") !=
        std::string::npos);
  CHECK(message.find("cuda:2 on the same GPU holds 0 bytes in use by tensors and 0 bytes cached") !=
        std::string::npos);
  CHECK(message.find("cuda:1 has 12.00 MiB in use by tensors") != std::string::npos);
  CHECK(message.find("fake GPU 0 with") != std::string::npos);
  a0.deallocate(used0, 14 * MiB);
  a1.deallocate(used1, 12 * MiB);
}

TEST_CASE("direct allocators on a shared GPU say so when it is full") {
  FakeMachine m(1, {0, 0}, 10 * MiB, /*direct=*/true);
  DeviceAllocator& a0 = m.table.get(Device::cuda(0));
  DeviceAllocator& a1 = m.table.get(Device::cuda(1));
  void* p = a0.allocate(8 * MiB);
  CHECK_THROWS_WITH_AS(a1.allocate(4 * MiB), doctest::Contains("cuda:0 on the same GPU holds 8.00 MiB in use"),
                       weft::Error);
  a0.deallocate(p, 8 * MiB);
  void* q = a1.allocate(4 * MiB);
  CHECK(q != nullptr);
  a1.deallocate(q, 4 * MiB);
}

TEST_CASE("two logical devices running out of memory at once relieve each other without deadlock") {
  FakeMachine m(1, {0, 0}, 48 * MiB);
  std::atomic<int> relieved_failures{0}, other_failures{0};
  auto worker = [&](int index) {
    DeviceAllocator& a = m.table.get(Device::cuda(index));
    for (int i = 0; i < 300; ++i) {
      // 12-23 MiB blocks, each in a segment of its own: the two caches keep crowding each other out.
      const size_t size = (12 + static_cast<size_t>((i * 7 + index * 5) % 12)) * MiB;
      try {
        void* p = a.allocate(size);
        a.deallocate(p, size);
      } catch (const weft::Error& e) {
        // Possible (the other thread may refill its cache between the relief and the retry,
        // as in PyTorch), but only as a complete out-of-memory report.
        const std::string what = e.what();
        ++(what.find("after synchronising GPU 0") != std::string::npos ? relieved_failures : other_failures);
      }
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  CHECK(other_failures.load() == 0);
  m.table.get(Device::cuda(0)).empty_cache();
  m.table.get(Device::cuda(1)).empty_cache();
  CHECK(m.gpus[0].used == 0);
}
