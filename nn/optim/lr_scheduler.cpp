// Learning-rate schedulers: the shared step / state logic and each closed form.
#include "nn/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace weft::optim {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

bool is_whole(double v) { return std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15; }

// A scalar holding an integer, checked by the caller with is_whole.
int64_t as_int(double v) { return static_cast<int64_t>(v); }

// a + b * c with the product rounded before the sum, as Python rounds it: a compiler may fuse
// the two into one multiply-add (g++ does under -march=native, clang within one expression),
// one rounding fewer, and the rate would then differ from Python's in the last bit.
double add_rounded_product(double a, double b, double c) {
  volatile double product = b * c;
  return a + product;
}

}  // namespace

LRScheduler::LRScheduler(std::string name, Optimizer& optimizer) : name_(std::move(name)), optimizer_(optimizer) {
  if (!optimizer_.initial_lr()) optimizer_.set_initial_lr(optimizer_.lr());
  base_lr_ = *optimizer_.initial_lr();
}

void LRScheduler::start() {
  last_epoch_ = 0;
  last_lr_ = lr_at(0);
  optimizer_.set_lr(last_lr_);
}

void LRScheduler::step() {
  ++last_epoch_;
  last_lr_ = lr_at(last_epoch_);
  optimizer_.set_lr(last_lr_);
}

std::map<std::string, double> LRScheduler::state_dict() const {
  std::map<std::string, double> out = parameters();
  out["last_epoch"] = static_cast<double>(last_epoch_);
  out["base_lr"] = base_lr_;
  return out;
}

void LRScheduler::check_state_dict(const std::map<std::string, double>& state) const {
  const std::string where = name_ + ".load_state_dict";
  std::map<std::string, double> expected = state_dict();
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, value] : expected)
    if (!state.count(key)) missing.push_back(key);
  for (const auto& [key, value] : state)
    if (!expected.count(key)) unexpected.push_back(key);
  if (!missing.empty() || !unexpected.empty()) {
    std::string problems = missing.empty() ? "" : "missing " + join(missing);
    if (!unexpected.empty()) problems += (problems.empty() ? "" : "; ") + std::string("unexpected ") + join(unexpected);
    WEFT_FAIL(where, ": the state was not saved by ", name_, " (", problems, ")");
  }
  double last_epoch = state.at("last_epoch"), base_lr = state.at("base_lr");
  WEFT_CHECK(is_whole(last_epoch) && last_epoch >= 0, where, ": last_epoch must be a whole number >= 0, got ",
             last_epoch);
  WEFT_CHECK(base_lr >= 0, where, ": base_lr must be >= 0, got ", base_lr);
  check_parameters(state);
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& state) {
  check_state_dict(state);
  set_parameters(state);
  base_lr_ = state.at("base_lr");
  last_epoch_ = as_int(state.at("last_epoch"));
  last_lr_ = lr_at(last_epoch_);
}

// --- StepLR -----------------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  check_parameters(parameters());
  start();
}

double StepLR::lr_at(int64_t epoch) const {
  return base_lr() * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

std::map<std::string, double> StepLR::parameters() const {
  return {{"step_size", static_cast<double>(step_size_)}, {"gamma", gamma_}};
}

void StepLR::check_parameters(const std::map<std::string, double>& v) const {
  double step_size = v.at("step_size"), gamma = v.at("gamma");
  WEFT_CHECK(is_whole(step_size) && step_size >= 1, name(), ": step_size must be a whole number >= 1, got ", step_size);
  WEFT_CHECK(std::isfinite(gamma) && gamma >= 0, name(), ": gamma must be finite and >= 0, got ", gamma);
}

void StepLR::set_parameters(const std::map<std::string, double>& v) {
  step_size_ = as_int(v.at("step_size"));
  gamma_ = v.at("gamma");
}

// --- CosineAnnealingLR ------------------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler("CosineAnnealingLR", optimizer), T_max_(T_max), eta_min_(eta_min) {
  check_parameters(parameters());
  start();
}

double CosineAnnealingLR::lr_at(int64_t epoch) const {
  double phase = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(T_max_);
  return eta_min_ + (base_lr() - eta_min_) * (1 + std::cos(phase)) / 2;
}

std::map<std::string, double> CosineAnnealingLR::parameters() const {
  return {{"T_max", static_cast<double>(T_max_)}, {"eta_min", eta_min_}};
}

void CosineAnnealingLR::check_parameters(const std::map<std::string, double>& v) const {
  double t_max = v.at("T_max"), eta_min = v.at("eta_min");
  WEFT_CHECK(is_whole(t_max) && t_max >= 1, name(), ": T_max must be a whole number >= 1, got ", t_max);
  WEFT_CHECK(std::isfinite(eta_min) && eta_min >= 0, name(), ": eta_min must be finite and >= 0, got ", eta_min);
}

void CosineAnnealingLR::set_parameters(const std::map<std::string, double>& v) {
  T_max_ = as_int(v.at("T_max"));
  eta_min_ = v.at("eta_min");
}

// --- LinearLR ---------------------------------------------------------------------------

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler("LinearLR", optimizer),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  check_parameters(parameters());
  start();
}

double LinearLR::lr_at(int64_t epoch) const {
  // PyTorch's order of operations, so the values agree to the last bit.
  double done = static_cast<double>(std::min(total_iters_, epoch));
  return base_lr() * (start_factor_ + (end_factor_ - start_factor_) * done / static_cast<double>(total_iters_));
}

std::map<std::string, double> LinearLR::parameters() const {
  return {
      {"start_factor", start_factor_}, {"end_factor", end_factor_}, {"total_iters", static_cast<double>(total_iters_)}};
}

void LinearLR::check_parameters(const std::map<std::string, double>& v) const {
  double start = v.at("start_factor"), end = v.at("end_factor"), total = v.at("total_iters");
  WEFT_CHECK(start > 0 && start <= 1, name(), ": start_factor must be in (0, 1], got ", start);
  WEFT_CHECK(end >= 0 && end <= 1, name(), ": end_factor must be in [0, 1], got ", end);
  WEFT_CHECK(is_whole(total) && total >= 1, name(), ": total_iters must be a whole number >= 1, got ", total);
}

void LinearLR::set_parameters(const std::map<std::string, double>& v) {
  start_factor_ = v.at("start_factor");
  end_factor_ = v.at("end_factor");
  total_iters_ = as_int(v.at("total_iters"));
}

// --- WarmupCosineLR ---------------------------------------------------------------------

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t decay_steps, double min_lr)
    : LRScheduler("WarmupCosineLR", optimizer),
      warmup_steps_(warmup_steps),
      decay_steps_(decay_steps),
      min_lr_(min_lr) {
  check_parameters(parameters());
  start();
}

double WarmupCosineLR::lr_at(int64_t epoch) const {
  // nanoGPT's get_lr, operation for operation (Python evaluates left to right).
  if (epoch < warmup_steps_)
    return base_lr() * static_cast<double>(epoch + 1) / static_cast<double>(warmup_steps_ + 1);
  if (epoch > decay_steps_) return min_lr_;
  const double decay_ratio =
      static_cast<double>(epoch - warmup_steps_) / static_cast<double>(decay_steps_ - warmup_steps_);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
  return add_rounded_product(min_lr_, coeff, base_lr() - min_lr_);
}

std::map<std::string, double> WarmupCosineLR::parameters() const {
  return {{"warmup_steps", static_cast<double>(warmup_steps_)},
          {"decay_steps", static_cast<double>(decay_steps_)},
          {"min_lr", min_lr_}};
}

void WarmupCosineLR::check_parameters(const std::map<std::string, double>& v) const {
  double warmup = v.at("warmup_steps"), decay = v.at("decay_steps"), min_lr = v.at("min_lr");
  WEFT_CHECK(is_whole(warmup) && warmup >= 0, name(), ": warmup_steps must be a whole number >= 0, got ", warmup);
  WEFT_CHECK(is_whole(decay) && decay > warmup, name(), ": decay_steps must be a whole number > warmup_steps (",
             warmup, "), got ", decay);
  WEFT_CHECK(std::isfinite(min_lr) && min_lr >= 0, name(), ": min_lr must be finite and >= 0, got ", min_lr);
}

void WarmupCosineLR::set_parameters(const std::map<std::string, double>& v) {
  warmup_steps_ = as_int(v.at("warmup_steps"));
  decay_steps_ = as_int(v.at("decay_steps"));
  min_lr_ = v.at("min_lr");
}

// --- SequentialLR -----------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler("SequentialLR", optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  WEFT_CHECK(!schedulers_.empty(), name(), ": expects at least one scheduler");
  WEFT_CHECK(milestones_.size() + 1 == schedulers_.size(), name(),
             ": expects one milestone fewer than schedulers, got ", schedulers_.size(), " schedulers and ",
             milestones_.size(), " milestones");
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    WEFT_CHECK(schedulers_[k] != nullptr, name(), ": scheduler ", k, " is null");
    WEFT_CHECK(&schedulers_[k]->optimizer() == &optimizer, name(), ": scheduler ", k, " (", schedulers_[k]->name(),
               ") acts on another optimizer; every part must act on the optimizer given to SequentialLR");
  }
  for (size_t k = 0; k < milestones_.size(); ++k)
    WEFT_CHECK(milestones_[k] > (k == 0 ? 0 : milestones_[k - 1]), name(),
               ": milestones must be positive and strictly increasing, got ", milestones_[k], " at index ", k);
  start();
}

double SequentialLR::lr_at(int64_t epoch) const {
  size_t k = std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  int64_t offset = k == 0 ? 0 : milestones_[k - 1];
  return schedulers_[k]->lr_at(epoch - offset);
}

std::map<std::string, double> SequentialLR::parameters() const {
  std::map<std::string, double> out;
  for (size_t k = 0; k < milestones_.size(); ++k)
    out["milestones." + std::to_string(k)] = static_cast<double>(milestones_[k]);
  for (size_t k = 0; k < schedulers_.size(); ++k)
    for (const auto& [key, value] : schedulers_[k]->state_dict()) out[std::to_string(k) + "." + key] = value;
  return out;
}

std::vector<std::map<std::string, double>> SequentialLR::split(const std::map<std::string, double>& values) const {
  std::vector<std::map<std::string, double>> parts(schedulers_.size());
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    const std::string prefix = std::to_string(k) + ".";
    for (const auto& [key, value] : values)
      if (key.starts_with(prefix)) parts[k][key.substr(prefix.size())] = value;
  }
  return parts;
}

void SequentialLR::check_parameters(const std::map<std::string, double>& values) const {
  for (size_t k = 0; k < milestones_.size(); ++k) {
    double m = values.at("milestones." + std::to_string(k));
    double previous = k == 0 ? 0 : values.at("milestones." + std::to_string(k - 1));
    WEFT_CHECK(is_whole(m) && m > previous, name(),
               ": milestones must be positive and strictly increasing whole "
               "numbers, got ",
               m, " at index ", k);
  }
  auto parts = split(values);
  for (size_t k = 0; k < schedulers_.size(); ++k) schedulers_[k]->check_state_dict(parts[k]);
}

void SequentialLR::set_parameters(const std::map<std::string, double>& values) {
  for (size_t k = 0; k < milestones_.size(); ++k) milestones_[k] = as_int(values.at("milestones." + std::to_string(k)));
  auto parts = split(values);
  for (size_t k = 0; k < schedulers_.size(); ++k) schedulers_[k]->load_state_dict(parts[k]);
}

}  // namespace weft::optim
