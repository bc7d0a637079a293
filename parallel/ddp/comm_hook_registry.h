// The communication hooks by name, for command lines and configuration files (weft-train's
// --comm-hook, bench/ddp_overhead). It sits above every hook it names (comm_hooks.h,
// powersgd_hook.h), so that the hooks themselves depend only on the hook type.
#pragma once

#include <string>

#include "parallel/ddp/comm_hooks.h"

namespace weft::parallel {

// "allreduce", "fp16", "bf16" or "powersgd" (powersgd: parallel/ddp/powersgd_hook.h with its
// rank 1 and a warm-up of 10 iterations); another name is an error that lists them.
CommHook comm_hook_named(const std::string& name);

}  // namespace weft::parallel
