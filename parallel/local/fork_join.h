// fork_join: run tasks on threads of their own, as the calling thread would, and wait.
//
// parallel_apply (one thread per replica) and per-stage pipeline threads do work for the
// thread that started them. Each task runs on a new thread that first takes on the
// caller's thread state (grad mode, current streams, autograd numbering:
// core/thread_state.h) and a share of the caller's CPU threads (each of n tasks gets
// num_threads() / n, at least one: kernels/cpu/threads.h), so that n logical CPU devices
// working at once do not oversubscribe the cores. When all tasks are done the caller's
// autograd numbering continues after the furthest task's, so nodes it makes next sort
// after every node the tasks made (Note [Execution order] in core/engine.cpp).
//
// A task's exception is caught on its thread and returned, one slot per task (null when
// it succeeded): the caller decides how to report it (parallel_apply names the replica
// and its device).
#pragma once

#include <exception>
#include <functional>
#include <vector>

namespace weft::parallel {

std::vector<std::exception_ptr> fork_join(const std::vector<std::function<void()>>& tasks);

}  // namespace weft::parallel
