// gradcheck: the full analytic Jacobian against central differences.
#include "core/gradcheck.h"

#include <cmath>
#include <sstream>

#include "core/autograd.h"

namespace weft {

namespace {

// Address of the element at row-major position k of a CPU float64 tensor of any strides.
double* element_at(const Tensor& t, int64_t k) {
  int64_t offset = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    int64_t n = t.shape()[d];
    offset += (k % n) * t.strides()[d];
    k /= n;
  }
  return static_cast<double*>(t.raw_data()) + offset;
}

std::vector<double> values_of(const Tensor& t) { return t.detach().to_vector<double>(); }

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    WEFT_CHECK(x.dtype() == DType::Float64 && x.is_leaf() && x.device().is_cpu(), "gradcheck: input ", i,
               " must be a float64 CPU leaf tensor, got ", x.dtype(), " on ", x.device(),
               x.is_leaf() ? "" : " (not a leaf)");
    checked.push_back(i);
  }
  WEFT_CHECK(!checked.empty(), "gradcheck: no input requires grad");

  Tensor out = fn(inputs);
  WEFT_CHECK(out.dtype() == DType::Float64, "gradcheck: the function must return float64, got ", out.dtype());
  const int64_t m = out.numel();

  // analytic[c][j * n + k]: d out_j / d input_c[k]
  std::vector<std::vector<double>> analytic(checked.size());
  for (size_t c = 0; c < checked.size(); ++c) analytic[c].assign(m * inputs[checked[c]].numel(), 0.0);
  if (out.requires_grad()) {
    for (int64_t j = 0; j < m; ++j) {
      for (size_t i : checked) Tensor(inputs[i]).set_grad(Tensor());
      Tensor one_hot = zeros(out.shape(), TensorOptions(DType::Float64, out.device()));
      one_hot.data_ptr<double>()[j] = 1.0;
      out.backward(one_hot, /*retain_graph=*/true);
      for (size_t c = 0; c < checked.size(); ++c) {
        const Tensor& grad = inputs[checked[c]].grad();
        if (!grad.defined()) continue;
        std::vector<double> row = values_of(grad);
        std::copy(row.begin(), row.end(), analytic[c].begin() + j * static_cast<int64_t>(row.size()));
      }
    }
    for (size_t i : checked) Tensor(inputs[i]).set_grad(Tensor());
  }

  NoGradGuard no_grad;
  for (size_t c = 0; c < checked.size(); ++c) {
    const Tensor& x = inputs[checked[c]];
    const int64_t n = x.numel();
    for (int64_t k = 0; k < n; ++k) {
      double* p = element_at(x, k);
      const double saved = *p;
      *p = saved + options.eps;
      std::vector<double> plus = values_of(fn(inputs));
      *p = saved - options.eps;
      std::vector<double> minus = values_of(fn(inputs));
      *p = saved;
      for (int64_t j = 0; j < m; ++j) {
        double numeric = (plus[j] - minus[j]) / (2 * options.eps);
        double a = analytic[c][j * n + k];
        if (!(std::fabs(a - numeric) <= options.atol + options.rtol * std::fabs(numeric))) {
          std::ostringstream msg;
          msg << "gradcheck: input " << checked[c] << " (shape " << x.shape() << "), element " << k
              << ", output element " << j << ": analytic " << a << " vs numeric " << numeric;
          return {false, msg.str()};
        }
      }
    }
  }
  return {};
}

}  // namespace weft
