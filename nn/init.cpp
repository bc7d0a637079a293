// Initialisers: a draw from rand / randn on the tensor's own dtype and device, scaled and
// copied in under NoGradGuard.
#include "nn/init.h"

#include <cmath>

#include "core/autograd.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"

namespace weft::nn::init {

namespace {

void check_floating(const Tensor& tensor, const char* op) {
  WEFT_CHECK(tensor.defined(), "nn::init::", op, ": the tensor is undefined");
  WEFT_CHECK(is_floating(tensor.dtype()), "nn::init::", op, ": expected a floating tensor, got ", tensor.dtype());
}

TensorOptions options_of(const Tensor& tensor) { return TensorOptions(tensor.dtype(), tensor.device()); }

int64_t fan(const Tensor& tensor, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return mode == FanMode::FanIn ? fan_in : fan_out;
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv2d:
    case Nonlinearity::Sigmoid:
      return 1.0;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::Relu:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyRelu:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  WEFT_FAIL("nn::init::calculate_gain: unknown nonlinearity");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  WEFT_CHECK(tensor.defined(), "nn::init::calculate_fan_in_and_fan_out: the tensor is undefined");
  WEFT_CHECK(tensor.dim() >= 2,
             "nn::init::calculate_fan_in_and_fan_out: fan in and fan out need a tensor of at least 2 dims, got shape ",
             tensor.shape());
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

const Tensor& uniform_(const Tensor& tensor, double a, double b, Generator* gen) {
  check_floating(tensor, "uniform_");
  WEFT_CHECK(a <= b, "nn::init::uniform_: expected a <= b, got a = ", a, ", b = ", b);
  NoGradGuard no_grad;
  tensor.copy_(add(mul(rand(tensor.shape(), options_of(tensor), gen), b - a), a));
  return tensor;
}

const Tensor& normal_(const Tensor& tensor, double mean, double std, Generator* gen) {
  check_floating(tensor, "normal_");
  WEFT_CHECK(std >= 0, "nn::init::normal_: expected std >= 0, got ", std);
  NoGradGuard no_grad;
  tensor.copy_(add(mul(randn(tensor.shape(), options_of(tensor), gen), std), mean));
  return tensor;
}

const Tensor& constant_(const Tensor& tensor, double value) {
  WEFT_CHECK(tensor.defined(), "nn::init::constant_: the tensor is undefined");
  NoGradGuard no_grad;
  fill_(tensor, value);
  return tensor;
}

const Tensor& zeros_(const Tensor& tensor) { return constant_(tensor, 0.0); }
const Tensor& ones_(const Tensor& tensor) { return constant_(tensor, 1.0); }

const Tensor& kaiming_uniform_(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                               Generator* gen) {
  check_floating(tensor, "kaiming_uniform_");
  if (tensor.numel() == 0) return tensor;  // PyTorch only warns: nothing to fill
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(tensor, mode)));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(tensor, -bound, bound, gen);
}

const Tensor& kaiming_normal_(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                              Generator* gen) {
  check_floating(tensor, "kaiming_normal_");
  if (tensor.numel() == 0) return tensor;
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(tensor, mode)));
  return normal_(tensor, 0.0, std, gen);
}

const Tensor& xavier_uniform_(const Tensor& tensor, double gain, Generator* gen) {
  check_floating(tensor, "xavier_uniform_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(tensor, -bound, bound, gen);
}

const Tensor& xavier_normal_(const Tensor& tensor, double gain, Generator* gen) {
  check_floating(tensor, "xavier_normal_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return normal_(tensor, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

}  // namespace weft::nn::init
