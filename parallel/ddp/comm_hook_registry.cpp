// The communication hooks by name; see comm_hook_registry.h.
#include "parallel/ddp/comm_hook_registry.h"

#include <memory>

#include "core/error.h"
#include "parallel/ddp/powersgd_hook.h"

namespace weft::parallel {

CommHook comm_hook_named(const std::string& name) {
  if (name == "allreduce") return allreduce_hook();
  if (name == "fp16") return fp16_compress_hook();
  if (name == "bf16") return bf16_compress_hook();
  if (name == "powersgd")
    return powersgd_hook(std::make_shared<PowerSGDState>(PowerSGDOptions{.start_iteration = 10}));
  WEFT_FAIL("unknown communication hook '", name, "' (weft has allreduce, fp16, bf16 and powersgd)");
}

}  // namespace weft::parallel
