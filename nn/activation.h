// Parameter-free layers: ReLU, GELU, Dropout and Flatten (torch.nn's names and defaults).
#pragma once

#include <cstdint>

#include <vector>

#include "core/generator.h"
#include "kernels/elementwise.h"
#include "nn/module.h"

namespace weft::nn {

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() : Cloneable("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

// torch.nn.GELU: the exact (erf) form by default, PyTorch's approximate='none'; the tanh
// form with GeluApproximate::Tanh (kernels/elementwise.h).
class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::None) : Cloneable("GELU"), approximate_(approximate) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  GeluApproximate approximate() const { return approximate_; }

 private:
  GeluApproximate approximate_;
};

// Zeroes elements with probability p and scales the rest by 1 / (1 - p) in training; the
// identity in evaluation. The masks come from the default generator of the input's
// device, or from `gen`, which must outlive the layer and its clones. A clone or replica
// shares `gen`: replicas running on several threads (DataParallel) then take their masks
// from one stream in whatever order the threads reach it, so leave it null where runs
// must repeat bit for bit; each device's own generator does not depend on thread order.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  double p() const { return p_; }
  Generator* generator() const { return gen_; }  // its own, or null: the input device's default

 private:
  double p_;
  Generator* gen_;
};

// The generators that `module`'s forward on `device` may draw from: the device's default
// generator, then each generator of its own that a Dropout in the tree holds (once each). What
// rewinds a forward's random numbers (a pipeline's recomputation) or leaves them untouched (a
// measurement) saves and restores these.
std::vector<Generator*> forward_generators(const Module& module, Device device);

// Flattens dims start_dim..end_dim into one (a view when the strides allow it).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  int64_t start_dim_;
  int64_t end_dim_;
};

}  // namespace weft::nn
