// weft-train's flag checks (apps/flag_checks.h): any text gets an answer, never a crash; text
// an integer check accepts converts to a value in its range, as CLI11 will convert it.
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include "apps/flag_checks.h"
#include "fuzz_target.h"

namespace {

// Text a check accepts converts, as CLI11 converts it, to a value in the check's range.
void check_integer(const std::string& text, CLI::Validator v, long long lo, long long hi) {
  std::string copy = text;
  if (!v(copy).empty()) return;
  long long value = 0;
  if (!CLI::detail::lexical_cast(text, value) || value < lo || value > hi) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  check_integer(text, weft::flags::positive_integer(), 1, std::numeric_limits<int>::max());
  check_integer(text, weft::flags::non_negative_integer(), 0, std::numeric_limits<int>::max());
  check_integer(text, weft::flags::integer(0, 64, "an integer from 0 to 64"), 0, 64);
  std::string copy = text;
  if (weft::flags::unsigned_64()(copy).empty()) {
    uint64_t value = 0, expected = 0;
    const char* first = text.data() + (text[0] == '+' ? 1 : 0);
    std::from_chars(first, text.data() + text.size(), expected);
    if (!CLI::detail::lexical_cast(text, value) || value != expected) __builtin_trap();
  }
  for (CLI::Validator v : {weft::flags::positive_number(), weft::flags::non_negative_number(),
                           weft::flags::number(0, 1, false, "a number from 0 to 1")}) {
    copy = text;
    if (v(copy).empty()) {
      double value = 0;
      if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value) || value < 0) __builtin_trap();
    }
  }
  copy = text;
  weft::flags::non_empty("a device")(copy);
  return 0;
}
