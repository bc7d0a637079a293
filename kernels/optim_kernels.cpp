// The dispatch stubs of the optimizer kernels (their callers are in nn/optim/).
#include "kernels/optim_kernels.h"

namespace weft {

constinit DispatchStub<SgdStepFn> sgd_step_stub{"SGD.step"};
constinit DispatchStub<AdamStepFn> adam_step_stub{"Adam.step"};
constinit DispatchStub<NormPowerSumFn> norm_power_sum_stub{"clip_grad_norm_"};
constinit DispatchStub<ClipScaleFn> clip_scale_stub{"clip_grad_norm_ (scale)"};

}  // namespace weft
