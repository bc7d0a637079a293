// ThreadState: capture on the parent, apply in the worker, restore after.
#include "core/thread_state.h"

#include "core/autograd.h"

namespace weft {

ThreadState ThreadState::capture() {
  return ThreadState{GradMode::is_enabled(), this_thread_stream_overrides(), weft::next_sequence_nr()};
}

ThreadStateGuard::ThreadStateGuard(const ThreadState& state) : saved_(ThreadState::capture()) {
  GradMode::set_enabled(state.grad_enabled);
  this_thread_stream_overrides() = state.streams;
  set_next_sequence_nr(state.next_sequence_nr);
}

ThreadStateGuard::~ThreadStateGuard() {
  GradMode::set_enabled(saved_.grad_enabled);
  this_thread_stream_overrides() = std::move(saved_.streams);
  // The numbering is not restored: this thread's later nodes still come after the ones
  // it made under the guard.
  if (next_sequence_nr() < saved_.next_sequence_nr) set_next_sequence_nr(saved_.next_sequence_nr);
}

}  // namespace weft
