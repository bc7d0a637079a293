// Progress: one epoch's progress as a bar on a terminal (step, loss, img/s or tok/s, ETA,
// redrawn in place) or as a few plain lines elsewhere (logs, CI), never both.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace weft::train {

class Progress {
 public:
  // bar: redraw a bar in place; otherwise print a plain line every 10% of the epoch.
  // steps: the epoch's batches; first_step: those trained before this pass (an epoch resumed
  // from a mid-epoch checkpoint), which the count includes and the speed and ETA do not.
  // unit: what the speed counts, per second ("img", "tok").
  Progress(std::ostream& out, bool bar, int epoch, int epochs, int64_t steps, int64_t first_step = 0,
           std::string unit = "img");
  // steps_done counts from the epoch's start; units_done (images, tokens) from this pass's.
  void update(int64_t steps_done, double loss, int64_t units_done);
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
  std::string unit_;
  int64_t next_line_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace weft::train
