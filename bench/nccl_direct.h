// ncclAllReduce called directly: the reference beside weft's nccl backend in
// bench/allreduce (built only with NCCL; direct_nccl_built() says whether it was).
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "parallel/store/store.h"

namespace weft::bench {

bool direct_nccl_built();

struct DirectResult {
  double us = 0;       // one in-place all-reduce, the mean over the timed calls
  int64_t wrong = 0;   // elements that differ from the exact sum afterwards
};

// One NCCL communicator of its own (the id handed over through `store`) and a buffer of
// `max_bytes` on GPU `gpu` (a physical index), on a stream of its own.
class DirectNccl {
 public:
  DirectNccl(parallel::Store& store, int rank, int size, int gpu, int64_t max_bytes);
  ~DirectNccl();
  DirectNccl(const DirectNccl&) = delete;
  DirectNccl& operator=(const DirectNccl&) = delete;
  // Every rank contributes rank + 1 in each of `count` elements: a warm-up call, `iters`
  // timed calls (host clock around them, the stream synchronised), then a check.
  DirectResult all_reduce(int64_t count, DType dtype, int iters);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace weft::bench
