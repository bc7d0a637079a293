// SGD: checks, state and the call of the fused kernel.
#include "nn/optim/sgd.h"

#include "kernels/optim_kernels.h"

namespace weft::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), std::nullopt}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : MultiTensorOptimizer("SGD", std::move(groups), options.lr, {"momentum_buffer"}, /*counts_steps=*/false),
      options_(options) {
  check(options_);
}

void SGD::check(const SGDOptions& o) const {
  check_hyperparameter(o.lr >= 0, "learning rate", o.lr, "must be >= 0");
  check_hyperparameter(o.momentum >= 0, "momentum value", o.momentum, "must be >= 0");
  check_hyperparameter(o.dampening >= 0, "dampening value", o.dampening, "must be >= 0");
  check_hyperparameter(o.weight_decay >= 0, "weight_decay value", o.weight_decay, "must be >= 0");
  WEFT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), name(),
             ": Nesterov momentum requires a momentum > 0 and zero dampening (got momentum ", o.momentum,
             ", dampening ", o.dampening, ")");
}

SGDOptions SGD::options() const {
  SGDOptions o = options_;
  o.lr = lr();
  return o;
}

void SGD::update(const StepGroup& group) {
  std::vector<Tensor> buffers;
  std::vector<uint8_t> new_buffer;
  if (options_.momentum != 0) {
    for (size_t k = 0; k < group.index.size(); ++k) {
      Tensor& buffer = state(group.index[k]).slots[0];
      // A parameter's first step with momentum starts the buffer from its gradient
      // (the kernel writes every element).
      new_buffer.push_back(!buffer.defined());
      if (!buffer.defined()) buffer = empty_like(group.params[k]);
      buffers.push_back(buffer);
    }
  }
  SgdHyper hyper{lr(),
                 options_.momentum,
                 options_.dampening,
                 group.weight_decay.value_or(options_.weight_decay),
                 options_.nesterov,
                 options_.maximize};
  sgd_step_stub(group.device, group.params, group.grads, buffers, new_buffer, hyper);
}

std::map<std::string, double> SGD::hyperparameters() const {
  return {{"momentum", options_.momentum},
          {"dampening", options_.dampening},
          {"weight_decay", options_.weight_decay},
          {"nesterov", options_.nesterov ? 1.0 : 0.0},
          {"maximize", options_.maximize ? 1.0 : 0.0}};
}

SGDOptions SGD::from_scalars(const std::map<std::string, double>& s) {
  SGDOptions o;
  o.lr = s.at("lr");
  o.momentum = s.at("momentum");
  o.dampening = s.at("dampening");
  o.weight_decay = s.at("weight_decay");
  o.nesterov = s.at("nesterov") != 0;
  o.maximize = s.at("maximize") != 0;
  return o;
}

void SGD::check_hyperparameters(const std::map<std::string, double>& scalars) const { check(from_scalars(scalars)); }

void SGD::set_hyperparameters(const std::map<std::string, double>& scalars) { options_ = from_scalars(scalars); }

}  // namespace weft::optim
