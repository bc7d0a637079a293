// Built instead of process_group_gloo.cpp when weft is configured without Gloo.
#include "core/error.h"
#include "parallel/process_group/process_group_gloo.h"

namespace weft::parallel {

bool gloo_available() { return false; }

std::shared_ptr<ProcessGroup> new_gloo_group(std::shared_ptr<Store>, int, int, std::chrono::milliseconds,
                                             const std::string&) {
  WEFT_FAIL("the gloo backend is not available: weft was built without Gloo (apt-get install libgloo-dev, then "
            "configure with -DWEFT_GLOO=ON)");
}

}  // namespace weft::parallel
