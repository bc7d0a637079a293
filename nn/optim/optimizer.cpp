// Optimizer: the parameter checks and the learning rate every optimizer shares.
#include "nn/optim/optimizer.h"

#include "core/autograd.h"

namespace weft::optim {

Optimizer::Optimizer(std::string name, std::vector<Tensor> params, double lr)
    : name_(std::move(name)), params_(std::move(params)), lr_(lr) {
  WEFT_CHECK(!params_.empty(), name_, ": got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    WEFT_CHECK(p.defined(), name_, ": parameter ", i, " is an undefined tensor");
    WEFT_CHECK(p.is_leaf(), name_, ": parameter ", i, " is not a leaf (it was made by ", p.grad_fn()->name(),
               "); an optimizer updates leaf tensors in place (use detach().requires_grad_() to make one)");
    WEFT_CHECK(p.requires_grad(), name_, ": parameter ", i,
               " does not require grad (call requires_grad_() on it, "
               "or leave it out)");
    for (size_t j = 0; j < i; ++j)
      WEFT_CHECK(!p.is_same(params_[j]), name_, ": parameter ", i, " is the same tensor as parameter ", j,
                 " (each parameter may appear once)");
  }
  check_hyperparameter(lr >= 0, "learning rate", lr, "must be >= 0");
}

void Optimizer::check_hyperparameter(bool ok, const char* what, double value, const char* rule) const {
  WEFT_CHECK(ok, name_, ": invalid ", what, ": ", value, " (", rule, ")");
}

void Optimizer::set_lr(double lr) {
  check_hyperparameter(lr >= 0, "learning rate", lr, "must be >= 0");
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (Tensor p : params_) p.set_grad(Tensor());
}

}  // namespace weft::optim
