// parallel_for: split an index range across the host's threads when it pays.
//
// Work below `grain` elements runs on the calling thread: a parallel region costs a few
// microseconds, more than a small op. Kernels never throw inside the body. The thread
// count is the calling thread's (kernels/cpu/threads.h). An internal header: <omp.h>
// stays out of the public API.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/threads.h"

namespace weft::cpu {

constexpr int64_t kGrain = 32768;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& body) {
  int64_t n = end - begin;
  if (n <= 0) return;
#ifdef _OPENMP
  int max_threads = omp_get_max_threads();
  if (n > grain && max_threads > 1 && !omp_in_parallel()) {
    int threads = static_cast<int>(std::min<int64_t>(max_threads, (n + grain - 1) / grain));
#pragma omp parallel num_threads(threads)
    {
      int64_t parts = omp_get_num_threads();
      int64_t chunk = (n + parts - 1) / parts;
      int64_t b = begin + omp_get_thread_num() * chunk;
      int64_t e = std::min(end, b + chunk);
      if (b < e) body(b, e);
    }
    return;
  }
#endif
  body(begin, end);
}

}  // namespace weft::cpu
