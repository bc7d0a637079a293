// Throwing lives out of line so that WEFT_CHECK expands to a branch and a call.
#include "core/error.h"

namespace weft::detail {

void throw_error(const char* /*file*/, int /*line*/, const std::string& message) {
  // The message is what the user acts on; file and line are kept out of it on purpose
  // (tests compare texts, and users should not need our source tree to understand it).
  throw Error(message);
}

}  // namespace weft::detail
