// PyTorch's parameter initialisers (torch.nn.init), in place and seeded.
//
// Every initialiser writes into an existing tensor under NoGradGuard (so a parameter that
// requires grad can be filled) and draws from a weft Generator: `gen` when given, else the
// default generator. The draws are Philox streams (core/generator.h), so a seed fixes
// every initial weight on any thread count and device. The values come from weft's own
// generator, so they follow PyTorch's distributions but are not bit-equal to PyTorch's.
#pragma once

#include <cstdint>
#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace weft::nn::init {

// Which fan kaiming_* scales by: fan_in keeps the forward pass's variance, fan_out the
// backward pass's.
enum class FanMode { FanIn, FanOut };
enum class Nonlinearity { Linear, Conv2d, Sigmoid, Tanh, Relu, LeakyRelu };

// The recommended gain for a nonlinearity (torch.nn.init.calculate_gain); `param` is the
// negative slope of LeakyRelu (PyTorch's default 0.01) and is ignored otherwise.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

// (fan_in, fan_out) of a weight of at least 2 dims: size(1) and size(0), each times the
// receptive field (the product of the dims after the first two).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

// U[a, b).
const Tensor& uniform_(const Tensor& tensor, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
// N(mean, std^2).
const Tensor& normal_(const Tensor& tensor, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
const Tensor& constant_(const Tensor& tensor, double value);
const Tensor& zeros_(const Tensor& tensor);
const Tensor& ones_(const Tensor& tensor);

// He et al. 2015: U(-bound, bound) with bound = gain * sqrt(3 / fan), gain =
// calculate_gain(nonlinearity, a). Linear and Conv2d use a = sqrt(5), which gives
// bound = 1 / sqrt(fan_in).
const Tensor& kaiming_uniform_(const Tensor& tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                               Nonlinearity nonlinearity = Nonlinearity::LeakyRelu, Generator* gen = nullptr);
// N(0, std^2) with std = gain / sqrt(fan).
const Tensor& kaiming_normal_(const Tensor& tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                              Nonlinearity nonlinearity = Nonlinearity::LeakyRelu, Generator* gen = nullptr);
// Glorot & Bengio 2010: U(-bound, bound) with bound = gain * sqrt(6 / (fan_in + fan_out)).
const Tensor& xavier_uniform_(const Tensor& tensor, double gain = 1.0, Generator* gen = nullptr);
// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
const Tensor& xavier_normal_(const Tensor& tensor, double gain = 1.0, Generator* gen = nullptr);

}  // namespace weft::nn::init
