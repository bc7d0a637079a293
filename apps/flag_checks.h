// Checks of command-line values that say in words what a flag accepts.
//
// CLI11's own checks print "Value 0 not in range 0.000000 to 1797...(309 digits)" for a
// positive number, call "fast" out of range instead of not a number, and let "-1" through
// to an unsigned flag as 2^64 - 1. These run before CLI11 converts the text, so every bad
// value gets one message of the form "--epochs: must be a positive integer, got '0'".
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>

namespace weft::flags {

namespace detail {

// The whole text as a decimal integer of type T (no sign on an unsigned T, no spaces, no
// rest, no leading zero: CLI11 then reads "010" as octal 8, which no user means).
template <class T>
bool parse_whole(const std::string& text, T& value) {
  if (text.empty() || (std::is_unsigned_v<T> && text[0] == '-')) return false;
  const char* last = text.data() + text.size();
  const char* digits = text.data() + (text[0] == '+' || text[0] == '-' ? 1 : 0);
  if (last - digits > 1 && *digits == '0') return false;
  const char* first = text.data() + (text[0] == '+' ? 1 : 0);  // from_chars takes '-', not '+'
  auto [end, ec] = std::from_chars(first, last, value);
  return ec == std::errc() && end == last;
}

inline bool parse_whole_number(const std::string& text, double& value) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(value);
}

inline std::string got(const std::string& text) { return ", got '" + text + "'"; }

}  // namespace detail

// An integer in [lo, hi]; `words` says which ("a positive integer", "an integer from 0 to 64").
template <class T>
CLI::Validator integer(T lo, T hi, std::string words) {
  return CLI::Validator(
      [lo, hi, words](std::string& text) -> std::string {
        T value{};
        const bool ok = detail::parse_whole(text, value) && value >= lo && value <= hi;
        return ok ? std::string() : "must be " + words + detail::got(text);
      },
      words);
}

inline CLI::Validator positive_integer() {
  return integer<int>(1, std::numeric_limits<int>::max(), "a positive integer");
}
inline CLI::Validator non_negative_integer() {
  return integer<int>(0, std::numeric_limits<int>::max(), "a non-negative integer");
}
inline CLI::Validator unsigned_64() {
  return integer<uint64_t>(0, std::numeric_limits<uint64_t>::max(), "an integer from 0 to 2^64 - 1");
}

// A finite number in [lo, hi] (lo excluded when `open_below`), e.g. a learning rate.
inline CLI::Validator number(double lo, double hi, bool open_below, std::string words) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!detail::parse_whole_number(text, value)) return "must be a number (" + words + ")" + detail::got(text);
        if (value < lo || value > hi || (open_below && value == lo)) return "must be " + words + detail::got(text);
        return {};
      },
      words);
}

inline CLI::Validator positive_number() {
  return number(0, std::numeric_limits<double>::max(), true, "a positive number");
}
inline CLI::Validator non_negative_number() {
  return number(0, std::numeric_limits<double>::max(), false, "a non-negative number");
}

// Not empty: `--device ""` would otherwise quietly mean the default.
inline CLI::Validator non_empty(std::string what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string { return text.empty() ? "must name " + what + ", got ''" : ""; },
      "not empty");
}

// Positive integers separated by commas ("1,3"), or `word` ("time").
inline CLI::Validator counts_or(std::string word) {
  return CLI::Validator(
      [word](std::string& text) -> std::string {
        if (text == word) return {};
        size_t begin = 0;
        while (true) {
          const size_t end = std::min(text.find(',', begin), text.size());
          int value = 0;
          if (!detail::parse_whole(text.substr(begin, end - begin), value) || value < 1)
            return "must be positive integers separated by commas (e.g. 1,3) or " + word + detail::got(text);
          if (end == text.size()) return {};
          begin = end + 1;
        }
      },
      "COUNTS or " + word);
}

}  // namespace weft::flags
