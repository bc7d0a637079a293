// Launch-failure messages and WEFT_CUDA_SYNC_LAUNCHES parsing (see launch_diagnostics.h).
// Plain C++: no CUDA here.
#include "kernels/cuda/launch_diagnostics.h"

#include <string_view>

#include "core/error.h"

namespace weft::cuda {

bool parse_sync_launches(const char* value) {
  if (value == nullptr) return false;
  const std::string_view text(value);
  if (text.empty() || text == "0") return false;
  if (text == "1") return true;
  WEFT_FAIL("WEFT_CUDA_SYNC_LAUNCHES='", text,
            "': expected 1 (synchronise and check after every kernel launch, naming the op) or 0 / unset (off)");
}

std::string launch_failure_message(const std::string& op, const char* error_name, const char* error_text,
                                   const char* file, int line, bool after_sync, bool sync_launches) {
  const std::string kernel = op.empty() ? std::string("a kernel") : "the kernel of " + op;
  std::string message = std::string("CUDA error ") + error_name + " (" + error_text + ") ";
  if (after_sync) {
    message += "in " + kernel + ", found by the synchronisation after its launch (WEFT_CUDA_SYNC_LAUNCHES=1)";
  } else {
    message += "launching " + kernel;
  }
  message += " at " + std::string(file) + ":" + std::to_string(line);
  // An earlier kernel's fault is sticky and shows up at the next launch check too, which
  // then names the wrong op; synchronising after every launch pins it to its own.
  if (!sync_launches)
    message += " (if an earlier kernel faulted, its error surfaces here: rerun with WEFT_CUDA_SYNC_LAUNCHES=1 to "
               "find the op that caused it)";
  return message;
}

}  // namespace weft::cuda
