// Helpers shared by the Store implementations (not part of the interface): error texts
// that are safe to build on any thread, key lists for messages, and timeouts clamped so
// that now + timeout never overflows the clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace weft::parallel::store_detail {

constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 365);

inline std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0), kMaxTimeout);
}

// strerror_r is the GNU one (returns the text) or the XSI one (fills the buffer).
[[maybe_unused]] inline std::string strerror_result(const char* r, const char*) { return r; }
[[maybe_unused]] inline std::string strerror_result(int r, const char* buf) { return r == 0 ? buf : "unknown error"; }
inline std::string errno_text(int err) {
  char buf[256] = {};
  return strerror_result(strerror_r(err, buf, sizeof buf), buf);
}

// 'a', 'b' and 3 more: a wait for every rank's key should not print them all.
inline std::string quoted_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 16;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > kShown) out += " and " + std::to_string(keys.size() - kShown) + " more";
  return out;
}

}  // namespace weft::parallel::store_detail
