// The deterministic-algorithms switch (see determinism.h).
#include "core/determinism.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace weft {

namespace {

// -1 until the first query reads WEFT_DETERMINISTIC or a program sets the switch.
std::atomic<int> state{-1};

}  // namespace

bool deterministic_setting(const char* value, bool fallback) {
  const std::string_view text = value == nullptr ? "" : value;
  if (text.empty()) return fallback;
  if (text == "1") return true;
  if (text == "0") return false;
  WEFT_FAIL("WEFT_DETERMINISTIC='", text,
            "': expected 1 (deterministic algorithms: the same bits in every process) or 0 (algorithms chosen by "
            "timing)");
}

bool deterministic_algorithms() {
  int now = state.load(std::memory_order_relaxed);
  if (now < 0) [[unlikely]] {
    // A malformed value throws here, at every query, until the program sets the switch.
    const int from_env = deterministic_setting(std::getenv("WEFT_DETERMINISTIC"), false) ? 1 : 0;
    int expected = -1;
    state.compare_exchange_strong(expected, from_env, std::memory_order_relaxed);
    now = state.load(std::memory_order_relaxed);
  }
  return now == 1;
}

void use_deterministic_algorithms(bool enabled) { state.store(enabled ? 1 : 0, std::memory_order_relaxed); }

}  // namespace weft
