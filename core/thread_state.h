// ThreadState: what a worker thread must inherit from the thread that hands it work.
//
// Grad mode, the current streams and the autograd numbering are thread-local, so a
// thread started by std::thread begins with grad mode on, every device on its default
// stream and node numbers from zero. parallel_apply and per-stage pipeline threads run
// forward (and backward) for their parent: they capture the parent's state before they
// start and apply it for the duration of the work (ThreadStateGuard), and the parent
// continues its numbering after the furthest worker (Note [Execution order] in
// core/engine.cpp says why the numbering matters).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/device.h"

namespace weft {

// The streams StreamGuards made current on a thread, innermost last (core/stream.cpp).
using StreamOverrides = std::vector<std::pair<Device, void*>>;
StreamOverrides& this_thread_stream_overrides();

struct ThreadState {
  bool grad_enabled = true;
  StreamOverrides streams;
  uint64_t next_sequence_nr = 0;

  // This thread's state now.
  static ThreadState capture();
};

// Applies `state` to this thread for the guard's lifetime, then restores what it had.
class ThreadStateGuard {
 public:
  explicit ThreadStateGuard(const ThreadState& state);
  ~ThreadStateGuard();
  ThreadStateGuard(const ThreadStateGuard&) = delete;
  ThreadStateGuard& operator=(const ThreadStateGuard&) = delete;

 private:
  ThreadState saved_;
};

// The autograd numbering of this thread: the number the next node will get. After workers
// have made nodes for it, a parent continues after the furthest of them.
uint64_t next_sequence_nr();
void set_next_sequence_nr(uint64_t next);

}  // namespace weft
