// Progress bar and plain progress lines.
#include "train/progress.h"

#include <unistd.h>

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <utility>

namespace weft::train {

Progress::Progress(std::ostream& out, bool bar, int epoch, int epochs, int64_t steps, int64_t first_step,
                   std::string unit)
    : out_(out), bar_(bar), epoch_(epoch), epochs_(epochs), steps_(steps), first_step_(first_step),
      unit_(std::move(unit)),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

bool Progress::is_terminal(const std::ostream& out) { return &out == &std::cout && ::isatty(STDOUT_FILENO); }

void Progress::update(int64_t steps_done, double loss, int64_t units_done) {
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = elapsed > 0 ? units_done / elapsed : 0;
  const int64_t done_here = steps_done - first_step_;
  double eta = done_here > 0 ? elapsed * (steps_ - steps_done) / done_here : 0;
  if (!due(steps_done)) return;
  if (bar_) {
    last_draw_ = now;
    constexpr int kWidth = 30;
    int filled = steps_ > 0 ? static_cast<int>(kWidth * steps_done / steps_) : kWidth;
    out_ << "\repoch " << epoch_ << "/" << epochs_ << " [" << std::string(filled, '=')
         << std::string(kWidth - filled, ' ') << "] " << steps_done << "/" << steps_ << " loss " << std::fixed
         << std::setprecision(4) << loss << " " << std::setprecision(0) << rate << " " << unit_ << "/s ETA " << eta
         << "s   " << std::flush;
    return;
  }
  next_line_ = steps_done + std::max<int64_t>(1, steps_ / 10);
  out_ << "epoch " << epoch_ << "/" << epochs_ << " step " << steps_done << "/" << steps_ << " loss " << std::fixed
       << std::setprecision(4) << loss << " " << std::setprecision(0) << rate << " " << unit_ << "/s ETA " << eta
       << "s\n" << std::flush;
}

bool Progress::due(int64_t steps_done) const {
  // Redrawing a bar more than ten times a second only costs time.
  if (bar_) return steps_done >= steps_ || std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
  return steps_done >= next_line_ && steps_done != first_step_;
}

void Progress::finish() {
  if (bar_) out_ << "\n";
}

}  // namespace weft::train
