// Learning-rate schedulers (torch.optim.lr_scheduler): StepLR, CosineAnnealingLR,
// LinearLR (warm-up) and SequentialLR (one schedule after another, e.g. warm-up then
// cosine); WarmupCosineLR is nanoGPT's get_lr, stepped once per optimizer step.
//
// A scheduler acts on an Optimizer's lr (it keeps a reference: the optimizer must
// outlive it). Like PyTorch's, constructing one records the optimizer's initial_lr
// (once per optimizer) and applies the schedule's epoch-0 value; each step() (per
// epoch or per iteration, as the caller decides) advances last_epoch by one and sets
// lr = lr_at(last_epoch). Every schedule is PyTorch's closed form
// (_get_closed_form_lr): the lr depends only on the epoch, not on the lr found in the
// optimizer, so two schedulers that step the same optimizer do not compose as
// PyTorch's chainable forms would; compose with SequentialLR instead.
//
// State for resume: scalars "last_epoch", "base_lr" and the schedule's parameters.
// load_state_dict restores them (the optimizer's lr comes back with the optimizer's own
// state, as in PyTorch).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/optim/optimizer.h"

namespace weft::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  const std::string& name() const { return name_; }
  void step();
  double get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  double base_lr() const { return base_lr_; }
  Optimizer& optimizer() const { return optimizer_; }

  // The learning rate after `epoch` steps (epoch >= 0).
  virtual double lr_at(int64_t epoch) const = 0;

  std::map<std::string, double> state_dict() const;
  // Checks the keys and values first; a state of another scheduler type is an error.
  void load_state_dict(const std::map<std::string, double>& state);
  // Throws what load_state_dict would throw for `state`; changes nothing.
  void check_state_dict(const std::map<std::string, double>& state) const;

 protected:
  LRScheduler(std::string name, Optimizer& optimizer);
  // Derived constructors end with this: epoch 0's lr goes into the optimizer.
  void start();
  // The schedule's own parameters (booleans and integers as doubles).
  virtual std::map<std::string, double> parameters() const = 0;
  // Throws for values this schedule refuses; changes nothing.
  virtual void check_parameters(const std::map<std::string, double>& values) const = 0;
  virtual void set_parameters(const std::map<std::string, double>& values) = 0;

 private:
  std::string name_;
  Optimizer& optimizer_;
  double base_lr_;
  int64_t last_epoch_ = 0;
  double last_lr_ = 0;
};

// lr = base_lr * gamma^floor(epoch / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch) const override;

 protected:
  std::map<std::string, double> parameters() const override;
  void check_parameters(const std::map<std::string, double>& values) const override;
  void set_parameters(const std::map<std::string, double>& values) override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2; periodic past
// T_max, as PyTorch's closed form.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);
  double lr_at(int64_t epoch) const override;

 protected:
  std::map<std::string, double> parameters() const override;
  void check_parameters(const std::map<std::string, double>& values) const override;
  void set_parameters(const std::map<std::string, double>& values) override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// Linear warm-up: lr = base_lr * (start + (end - start) * min(epoch, total_iters) / total_iters).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(int64_t epoch) const override;

 protected:
  std::map<std::string, double> parameters() const override;
  void check_parameters(const std::map<std::string, double>& values) const override;
  void set_parameters(const std::map<std::string, double>& values) override;

 private:
  double start_factor_;
  double end_factor_;
  int64_t total_iters_;
};

// nanoGPT's schedule (train.py's get_lr), with s = last_epoch, the number of optimizer
// steps taken (step() once after each optimizer step), W = warmup_steps, D = decay_steps:
//   s < W:       lr = base_lr * (s + 1) / (W + 1)                      linear warm-up
//   W <= s <= D: lr = min_lr + c * (base_lr - min_lr),                 cosine decay
//                c = 0.5 * (1 + cos(pi * (s - W) / (D - W)))
//   s > D:       lr = min_lr
// in that order of operations, so the values are nanoGPT's to the last bit. The rate reaches
// base_lr at s = W and min_lr at s = D (nanoGPT's lr_decay_iters, about the run's length;
// its min_lr is about base_lr / 10). 0 <= W < D.
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t decay_steps, double min_lr = 0);
  double lr_at(int64_t epoch) const override;

 protected:
  std::map<std::string, double> parameters() const override;
  void check_parameters(const std::map<std::string, double>& values) const override;
  void set_parameters(const std::map<std::string, double>& values) override;

 private:
  int64_t warmup_steps_;
  int64_t decay_steps_;
  double min_lr_;
};

// schedulers[k] from milestones[k-1] on, counting its epochs from that milestone (as
// PyTorch's SequentialLR, which restarts the next scheduler at each milestone). The
// parts must act on the same optimizer; SequentialLR uses their formulas and never
// steps them. Its state holds each part's parameters under "<k>.".
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(int64_t epoch) const override;

 protected:
  std::map<std::string, double> parameters() const override;
  void check_parameters(const std::map<std::string, double>& values) const override;
  void set_parameters(const std::map<std::string, double>& values) override;

 private:
  // The parts' own state_dicts, split out of SequentialLR's "<k>." keys.
  std::vector<std::map<std::string, double>> split(const std::map<std::string, double>& values) const;

  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace weft::optim
