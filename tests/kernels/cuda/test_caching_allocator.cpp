// The CUDA caching allocator's pool logic, on a fake device (fake_device_memory.h): runs
// on every machine.
#include <doctest/doctest.h>

#include "core/error.h"
#include "fake_device_memory.h"
#include "kernels/cuda/caching_allocator.h"

using weft::Device;
using weft::cuda::CachingAllocator;
using weft::test::FakeDevice;
using weft::test::FakeState;
using weft::test::MiB;

TEST_CASE("sizes round to 512 bytes and segments follow the request class") {
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB + 512) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB) == 10 * MiB);
  CHECK(CachingAllocator::segment_size(11 * MiB + 512) == 12 * MiB);
}

TEST_CASE("a freed block is reused on the same stream and small requests share a segment") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(1000);
  void* q = a.allocate(3000);
  CHECK(s.raw_allocations == 1);  // both cut from one 2 MiB segment
  CHECK(static_cast<char*>(q) - static_cast<char*>(p) == 1024);
  a.deallocate(p, 1000);
  CHECK(a.allocate(700) == p);    // best fit: the freed 1024-byte block
  CHECK(s.raw_allocations == 1);
  auto st = a.stats();
  CHECK(st.bytes_in_use == 3700);
  CHECK(st.bytes_reserved == static_cast<int64_t>(2 * MiB));
  CHECK(st.num_allocations == 2);
  CHECK(st.total_allocations == 3);
  CHECK(st.peak_bytes_in_use == 4000);
}

TEST_CASE("neighbouring free blocks merge back into the whole segment") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(4096);
  void* q = a.allocate(4096);
  void* r = a.allocate(4096);
  a.deallocate(q, 4096);
  a.deallocate(p, 4096);
  a.deallocate(r, 4096);
  CHECK(a.cached_bytes() == static_cast<int64_t>(2 * MiB));
  // A whole-segment request fits again only if the three blocks and the tail merged.
  void* big = a.allocate(MiB);
  CHECK(big == p);
  CHECK(s.raw_allocations == 1);
  a.deallocate(big, MiB);
  a.empty_cache();
  CHECK(s.used == 0);
  CHECK(a.stats().bytes_reserved == 0);
}

TEST_CASE("a large block is split and the rest serves the next large request") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(40 * MiB);
  a.deallocate(p, 40 * MiB);
  void* q = a.allocate(12 * MiB);
  void* r = a.allocate(20 * MiB);
  CHECK(q == p);
  CHECK(static_cast<char*>(r) == static_cast<char*>(p) + 12 * MiB);
  CHECK(s.raw_allocations == 1);
  a.deallocate(q, 12 * MiB);
  a.deallocate(r, 20 * MiB);
}

TEST_CASE("pools are per stream") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(1 << 16);
  a.deallocate(p, 1 << 16);
  s.stream = 2;
  void* q = a.allocate(1 << 16);
  CHECK(q != p);
  CHECK(s.raw_allocations == 2);  // stream 2 does not take stream 1's cached block
  a.deallocate(q, 1 << 16);
}

TEST_CASE("record_stream: a block used on another stream waits for that stream's work") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(8192);
  a.record_stream(p, 7);
  s.busy.insert(7);          // stream 7 is still reading p
  a.deallocate(p, 8192);
  void* q = a.allocate(8192);
  CHECK(q != p);             // not reused while stream 7 may read it
  CHECK(a.stats().bytes_in_use == 8192);
  s.busy.erase(7);           // stream 7 caught up
  void* r = a.allocate(8192);
  CHECK(r == p);
  CHECK(s.released_events == 1);
  a.deallocate(q, 8192);
  a.deallocate(r, 8192);
}

TEST_CASE("record_stream on the block's own stream needs no event") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(100);
  a.record_stream(p, s.stream);
  a.deallocate(p, 100);
  CHECK(s.next_event == 1);
  CHECK(a.allocate(100) == p);
  CHECK_THROWS_WITH_AS(a.record_stream(static_cast<char*>(p) + 8, 3),
                       doctest::Contains("not the start of a block"), weft::Error);
}

TEST_CASE("out of memory frees the cache, retries, then names what is used and cached") {
  FakeState s;
  s.capacity = 30 * MiB;
  CachingAllocator a(Device::cuda(3), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(16 * MiB);
  void* small = a.allocate(1000);
  a.deallocate(p, 16 * MiB);
  // 16 MiB cached + 2 MiB small segment: 20 MiB more fit only after the cache is freed.
  void* q = a.allocate(20 * MiB);
  CHECK(q != nullptr);
  CHECK(s.used == 22 * MiB);
  CHECK(s.device_synchronizations == 0);  // its own free segments were enough
  CHECK_THROWS_WITH_AS(a.allocate(9 * MiB),
                       doctest::Contains("CUDA out of memory on cuda:3: tried to allocate 9.00 MiB"), weft::Error);
  CHECK(s.device_synchronizations > 0);   // before failing, it synchronised and emptied again
  CHECK_THROWS_WITH_AS(a.allocate(9 * MiB), doctest::Contains("cuda:3 has 20.00 MiB in use by tensors"), weft::Error);
  CHECK_THROWS_WITH_AS(a.allocate(9 * MiB), doctest::Contains("after synchronising and emptying its own cache"),
                       weft::Error);
  CHECK_THROWS_WITH_AS(a.allocate(9 * MiB), doctest::Contains("fake GPU with"), weft::Error);
  a.deallocate(q, 20 * MiB);
  a.deallocate(small, 1000);
  CHECK(a.stats().bytes_in_use == 0);
}

TEST_CASE("out of memory waits for blocks held back by other streams before it fails") {
  FakeState s;
  s.capacity = 24 * MiB;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(20 * MiB);
  a.record_stream(p, 7);
  s.busy.insert(7);  // stream 7 still reads p: the block waits for its event
  a.deallocate(p, 20 * MiB);
  CHECK(a.cached_bytes() == static_cast<int64_t>(20 * MiB));
  // Only after a synchronisation is the segment free to give back.
  void* q = a.allocate(12 * MiB);
  CHECK(q != nullptr);
  CHECK(s.device_synchronizations == 1);
  CHECK(s.busy.empty());
  CHECK(s.used == 12 * MiB);
  a.deallocate(q, 12 * MiB);
}

TEST_CASE("synchronize_and_empty_cache gives back blocks that waited for other streams") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* p = a.allocate(12 * MiB);
  a.record_stream(p, 5);
  s.busy.insert(5);
  a.deallocate(p, 12 * MiB);
  a.empty_cache();  // no synchronisation: the block still waits
  CHECK(s.used == 12 * MiB);
  CHECK(a.synchronize_and_empty_cache() == static_cast<int64_t>(12 * MiB));
  CHECK(s.used == 0);
  CHECK(a.stats().bytes_reserved == 0);
}

TEST_CASE("release_free_segment gives back one whole free segment and nothing else") {
  FakeState s;
  s.capacity = 256 * MiB;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  void* keep = a.allocate(30 * MiB);
  a.deallocate(keep, 30 * MiB);   // cached, and must stay so
  void* search = a.allocate(64 * MiB);
  void* small = a.allocate(1000);
  void* small2 = a.allocate(1000);
  a.deallocate(search, 64 * MiB);
  a.deallocate(small2, 1000);
  CHECK(a.release_free_segment(search) == static_cast<int64_t>(64 * MiB));
  CHECK(a.release_free_segment(search) == 0);   // already gone
  CHECK(a.release_free_segment(small2) == 0);   // a piece of a segment still in use
  CHECK(a.release_free_segment(nullptr) == 0);
  CHECK(s.used == 30 * MiB + 2 * MiB);
  CHECK(a.stats().bytes_reserved == static_cast<int64_t>(32 * MiB));
  a.deallocate(small, 1000);
}

TEST_CASE("reset_peak and zero-byte allocations") {
  FakeState s;
  CachingAllocator a(Device::cuda(0), std::make_unique<FakeDevice>(s));
  CHECK(a.allocate(0) == nullptr);
  void* p = a.allocate(5000);
  a.deallocate(p, 5000);
  CHECK(a.stats().peak_bytes_in_use == 5000);
  a.reset_peak();
  CHECK(a.stats().peak_bytes_in_use == 0);
  a.deallocate(nullptr, 0);
}
