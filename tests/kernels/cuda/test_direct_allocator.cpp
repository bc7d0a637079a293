// WEFT_CUDA_ALLOCATOR and the direct allocator, on a fake device (fake_device_memory.h):
// runs on every machine.
#include <doctest/doctest.h>

#include <algorithm>

#include "core/error.h"
#include "fake_device_memory.h"
#include "kernels/cuda/direct_allocator.h"

using weft::Device;
using weft::cuda::AllocatorKind;
using weft::cuda::DirectAllocator;
using weft::cuda::StreamId;
using weft::test::FakeDevice;
using weft::test::FakeState;
using weft::test::MiB;

TEST_CASE("WEFT_CUDA_ALLOCATOR: caching by default, direct on request, anything else an error") {
  using weft::cuda::allocator_kind;
  CHECK(allocator_kind(nullptr) == AllocatorKind::Caching);
  CHECK(allocator_kind("") == AllocatorKind::Caching);
  CHECK(allocator_kind("caching") == AllocatorKind::Caching);
  CHECK(allocator_kind("direct") == AllocatorKind::Direct);
  for (const char* bad : {"Direct", "direct ", "1", "none", "cached"}) {
    CAPTURE(bad);
    const std::string named = "WEFT_CUDA_ALLOCATOR='" + std::string(bad) + "'";
    CHECK_THROWS_WITH_AS(allocator_kind(bad), doctest::Contains(named.c_str()), weft::Error);
    CHECK_THROWS_WITH_AS(allocator_kind(bad), doctest::Contains("expected 'caching' (the default"), weft::Error);
    CHECK_THROWS_WITH_AS(allocator_kind(bad), doctest::Contains("or 'direct'"), weft::Error);
  }
}

TEST_CASE("the direct allocator asks the device for exactly each block and gives it back at once") {
  FakeState s;
  DirectAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(1000);
  void* q = a.allocate(3);
  CHECK(s.allocation_sizes == std::vector<size_t>{1000, 3});  // no rounding, no segments
  CHECK(s.used == 1003);
  auto st = a.stats();
  CHECK(st.bytes_in_use == 1003);
  CHECK(st.bytes_reserved == 1003);  // nothing held beyond what is handed out
  CHECK(st.num_allocations == 2);
  a.deallocate(p, 1000);
  CHECK(s.used == 3);                // freed, not cached
  CHECK(a.cached_bytes() == 0);
  void* r = a.allocate(1000);
  CHECK(s.raw_allocations == 3);     // a new device allocation, never a reused block
  st = a.stats();
  CHECK(st.bytes_in_use == 1003);
  CHECK(st.peak_bytes_in_use == 1003);
  CHECK(st.total_allocations == 3);
  a.deallocate(q, 3);
  a.deallocate(r, 1000);
  CHECK(s.used == 0);
  CHECK(a.stats().bytes_reserved == 0);
  a.reset_peak();
  CHECK(a.stats().peak_bytes_in_use == 0);
  CHECK(a.allocate(0) == nullptr);
  a.deallocate(nullptr, 0);
}

TEST_CASE("the direct allocator frees only after every stream that used the block is done") {
  FakeState s;
  DirectAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(4096);
  a.record_stream(p, 7);
  a.record_stream(p, s.stream);  // its own stream: nothing more to wait for
  s.busy = {1, 7, 9};            // its stream, the recorded one, and an unrelated one
  a.deallocate(p, 4096);
  std::vector<StreamId> synced = s.synchronized_streams;
  std::sort(synced.begin(), synced.end());
  CHECK(synced == std::vector<StreamId>{1, 7});
  CHECK(s.busy_at_free == std::set<StreamId>{9});  // stream 9 never used the block
  CHECK(s.used == 0);
}

TEST_CASE("the direct allocator rejects unknown pointers and says what it holds when out of memory") {
  FakeState s;
  s.capacity = 10 * MiB;
  DirectAllocator a(Device::cuda(2), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(6 * MiB);
  CHECK_THROWS_WITH_AS(a.record_stream(static_cast<char*>(p) + 8, 3), doctest::Contains("not the start of a block"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(a.allocate(5 * MiB),
                       doctest::Contains("CUDA out of memory on cuda:2: tried to allocate 5.00 MiB"), weft::Error);
  CHECK_THROWS_WITH_AS(a.allocate(5 * MiB), doctest::Contains("WEFT_CUDA_ALLOCATOR=direct"), weft::Error);
  CHECK_THROWS_WITH_AS(a.allocate(5 * MiB), doctest::Contains("cuda:2 has 6.00 MiB in use by tensors"), weft::Error);
  CHECK_THROWS_WITH_AS(a.allocate(5 * MiB), doctest::Contains("fake GPU with"), weft::Error);
  int dummy = 0;
  a.deallocate(&dummy, 4);  // logged and ignored, never freed
  a.deallocate(p, 6 * MiB);
  CHECK(a.allocate(5 * MiB) != nullptr);  // leaked by the test's end: the destructor gives it back
}
