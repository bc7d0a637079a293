// gradcheck: compares autograd's gradient with central finite differences in float64.
//
// For f: inputs -> one output tensor, gradcheck builds the full Jacobian twice: the
// analytic one row by row (one backward per output element, each with a one-hot
// gradient) and the numerical one column by column ((f(x + eps) - f(x - eps)) / 2 eps
// per input element). Every entry must satisfy |analytic - numeric| <= atol + rtol *
// |numeric|. Inputs that require grad must be float64 leaves; others are held fixed.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace weft {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytic and numeric values
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace weft
