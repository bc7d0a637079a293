// weft::Error and WEFT_CHECK: the one way the library reports bad input.
//
// Messages are built only when a check fails, so a WEFT_CHECK on a hot path costs one
// branch. Every message should name the op and the shapes, dtypes or devices involved:
// WEFT_CHECK(a.dim() == 2, "matmul: expected a 2-d tensor, got shape ", a.shape()).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace weft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace weft

#define WEFT_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      ::weft::detail::throw_error(__FILE__, __LINE__, ::weft::detail::concat(__VA_ARGS__)); \
  } while (0)

#define WEFT_FAIL(...) ::weft::detail::throw_error(__FILE__, __LINE__, ::weft::detail::concat(__VA_ARGS__))
