// ReLU, GELU, Dropout, Flatten: thin layers over the functional ops.
#include "nn/activation.h"

#include <algorithm>
#include <sstream>

#include "kernels/dropout.h"
#include "kernels/elementwise.h"

namespace weft::nn {

Tensor ReLU::forward(const Tensor& input) { return relu(input); }

Tensor GELU::forward(const Tensor& input) { return gelu(input, approximate_); }

std::string GELU::extra_repr() const {
  return approximate_ == GeluApproximate::Tanh ? "approximate='tanh'" : "approximate='none'";
}

Dropout::Dropout(double p, Generator* gen) : Cloneable("Dropout"), p_(p), gen_(gen) {
  WEFT_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, p_, is_training(), gen_); }

std::vector<Generator*> forward_generators(const Module& module, Device device) {
  std::vector<Generator*> generators{&default_generator(device)};
  for (const auto& [name, child] : module.named_modules())
    if (const auto* dropout = dynamic_cast<const Dropout*>(child); dropout && dropout->generator())
      if (std::find(generators.begin(), generators.end(), dropout->generator()) == generators.end())
        generators.push_back(dropout->generator());
  return generators;
}

std::string Dropout::extra_repr() const {
  std::ostringstream out;
  out << "p=" << p_;
  return out.str();
}

Flatten::Flatten(int64_t start_dim, int64_t end_dim) : Cloneable("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}

Tensor Flatten::forward(const Tensor& input) { return input.flatten(start_dim_, end_dim_); }

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim_) + ", end_dim=" + std::to_string(end_dim_);
}

}  // namespace weft::nn
