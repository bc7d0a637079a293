// fork_join: one thread per task, the caller's state in each, the numbering merged after.
#include "parallel/local/fork_join.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include "core/thread_state.h"
#include "kernels/cpu/threads.h"

namespace weft::parallel {

std::vector<std::exception_ptr> fork_join(const std::vector<std::function<void()>>& tasks) {
  const size_t n = tasks.size();
  std::vector<std::exception_ptr> errors(n);
  if (n == 0) return errors;
  const ThreadState parent = ThreadState::capture();
  const int cpu_share = std::max(1, num_threads() / static_cast<int>(n));
  release_idle_cpu_threads();  // the caller's OpenMP workers would spin on the cores the tasks need
  std::vector<uint64_t> reached(n, parent.next_sequence_nr);
  {
    std::vector<std::jthread> threads;
    threads.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        ThreadStateGuard state(parent);
        CpuThreadBudget budget(cpu_share);
        try {
          tasks[i]();
        } catch (...) {
          errors[i] = std::current_exception();
        }
        reached[i] = next_sequence_nr();
      });
    }
  }  // the jthreads join here
  set_next_sequence_nr(std::max(next_sequence_nr(), *std::max_element(reached.begin(), reached.end())));
  return errors;
}

}  // namespace weft::parallel
