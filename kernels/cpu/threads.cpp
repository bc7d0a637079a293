// The CPU thread count and budgets, on OpenMP's per-thread setting (its nthreads ICV:
// omp_set_num_threads on a thread outside a parallel region changes that thread's own
// value, which its parallel regions then use).
#include "kernels/cpu/threads.h"

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"

namespace weft {

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int threads) {
  WEFT_CHECK(threads >= 1, "set_num_threads: expected at least 1 thread, got ", threads);
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
}

void release_idle_cpu_threads() {
#ifdef _OPENMP
  // OpenMP 5.0's omp_pause_resource_all (libgomp has it since GCC 9): a soft pause ends
  // the calling thread's pool of workers.
  if (!omp_in_parallel()) omp_pause_resource_all(omp_pause_soft);
#endif
}

CpuThreadBudget::CpuThreadBudget(int threads) : previous_(num_threads()) { set_num_threads(std::max(1, threads)); }

CpuThreadBudget::~CpuThreadBudget() { set_num_threads(previous_); }

}  // namespace weft
