// Progress: one epoch's progress as a bar on a terminal (step, loss, images/s, ETA,
// redrawn in place) or as a few plain lines elsewhere (logs, CI), never both.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>

namespace weft::train {

class Progress {
 public:
  // bar: redraw a bar in place; otherwise print a plain line every 10% of the epoch.
  // steps: the epoch's batches; first_step: those trained before this pass (an epoch resumed
  // from a mid-epoch checkpoint), which the count includes and the speed and ETA do not.
  Progress(std::ostream& out, bool bar, int epoch, int epochs, int64_t steps, int64_t first_step = 0);
  // steps_done counts from the epoch's start; images_done from this pass's.
  void update(int64_t steps_done, double loss, int64_t images_done);
  // Whether update(steps_done, ...) would draw: the loop reads the loss back from the
  // device (a host synchronisation on a GPU) only then.
  bool due(int64_t steps_done) const;
  void finish();

  // Whether `out` is std::cout connected to a terminal.
  static bool is_terminal(const std::ostream& out);

 private:
  std::ostream& out_;
  bool bar_;
  int epoch_, epochs_;
  int64_t steps_, first_step_;
  int64_t next_line_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace weft::train
