// The CPU kernels' threads: how many an op may use, per host thread.
//
// CPU kernels split their work over OpenMP threads (kernels/cpu/parallel.h). The count is
// a property of the host thread that calls the op: set_num_threads(n) sets it for the
// calling thread, and a thread started later begins with the process default (the
// machine's cores, or OMP_NUM_THREADS). When k host threads run ops at once (parallel_apply
// over k logical CPU devices), each gets a share of the cores through a CpuThreadBudget,
// so that together they do not oversubscribe the machine.
#pragma once

namespace weft {

// Threads the CPU kernels called from this thread may use.
int num_threads();
// Sets it for this thread; at least 1.
void set_num_threads(int threads);

// Ends this thread's idle OpenMP workers. After a parallel region they spin-wait for the
// next one (libgomp spins for milliseconds by default), which takes cores from threads
// about to start work of their own: fork_join calls this before it starts its tasks. The
// next parallel region on this thread starts its workers again (tens of microseconds).
// Does nothing inside a parallel region.
void release_idle_cpu_threads();

// For its lifetime, the CPU kernels called from this thread use at most `threads` threads.
class CpuThreadBudget {
 public:
  explicit CpuThreadBudget(int threads);
  ~CpuThreadBudget();
  CpuThreadBudget(const CpuThreadBudget&) = delete;
  CpuThreadBudget& operator=(const CpuThreadBudget&) = delete;

 private:
  int previous_;
};

}  // namespace weft
