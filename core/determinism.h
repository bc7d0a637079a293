// Deterministic algorithms: whether results must be the same bits in every process.
//
// Every weft kernel already gives the same bits for the same inputs, whatever the thread
// count or the scheduling. What can still differ between two processes is a choice made by
// measurement: cuDNN's convolution algorithms are, by default, timed on first use and the
// fastest kept, and timings vary from run to run, so a run resumed from a checkpoint may
// pick other algorithms (other rounding) than the run it continues. With deterministic
// algorithms on, every such choice is made from fixed rules instead (for cuDNN: the first
// deterministic algorithm in its heuristic order, which depends only on the GPU, the cuDNN
// version and the shapes; where cuDNN has none, weft's own kernel), at some cost in speed.
//
// Off by default in the library, as in PyTorch (torch.use_deterministic_algorithms);
// weft-train turns it on, since it promises resumed runs identical to uninterrupted ones.
// WEFT_DETERMINISTIC=1 or 0 sets the initial value for any program.
#pragma once

namespace weft {

bool deterministic_algorithms();
void use_deterministic_algorithms(bool enabled);

// The value WEFT_DETERMINISTIC asks for: `value` nullptr or "" gives `fallback`, "1" true,
// "0" false; anything else throws weft::Error naming the variable and what it accepts.
bool deterministic_setting(const char* value, bool fallback);

}  // namespace weft
