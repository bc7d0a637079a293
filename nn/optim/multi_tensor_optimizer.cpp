// MultiTensorOptimizer: the step driver (grouping by device, dtype and weight decay,
// contiguity, state checks) and state_dict / load_state_dict in the form nn/optim/optimizer.h
// describes.
#include "nn/optim/multi_tensor_optimizer.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

#include "core/autograd.h"

namespace weft::optim {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// "12" -> 12; anything that is not a plain decimal index -> nullopt.
std::optional<size_t> parse_index(const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return static_cast<size_t>(std::stoul(text));
}

std::string describe(const Tensor& t) {
  std::ostringstream out;
  out << t.dtype() << " " << t.shape() << " on " << t.device();
  return out.str();
}

}  // namespace

MultiTensorOptimizer::MultiTensorOptimizer(std::string name, std::vector<ParamGroup> groups, double lr,
                                           std::vector<std::string> slot_names, bool counts_steps)
    : Optimizer(std::move(name), params_of(groups), lr),
      slot_names_(std::move(slot_names)),
      counts_steps_(counts_steps) {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (const auto& decay = groups[g].weight_decay) {
      const std::string what = "weight_decay value of parameter group " + std::to_string(g);
      check_hyperparameter(*decay >= 0, what.c_str(), *decay, "must be >= 0");
    }
    weight_decay_.insert(weight_decay_.end(), groups[g].params.size(), groups[g].weight_decay);
  }
  state_.resize(this->params().size());
  for (ParamState& s : state_) s.slots.resize(slot_names_.size());
}

void MultiTensorOptimizer::check_state_matches(size_t param) const {
  const Tensor& p = params()[param];
  const Tensor& g = p.grad();
  WEFT_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), name(),
             ".step: the grad of parameter ", param, " is ", describe(g), " but the parameter is ", describe(p));
  for (size_t s = 0; s < slot_names_.size(); ++s) {
    const Tensor& t = state_[param].slots[s];
    if (!t.defined()) continue;
    WEFT_CHECK(t.shape() == p.shape() && t.dtype() == p.dtype() && t.device() == p.device(), name(), ".step: state '",
               slot_names_[s], "' of parameter ", param, " is ", describe(t), " but the parameter is now ", describe(p),
               " (move or convert the model before creating the optimizer, or load_state_dict after moving it)");
  }
}

void MultiTensorOptimizer::step() {
  NoGradGuard no_grad;
  std::vector<size_t> active;
  for (size_t i = 0; i < params().size(); ++i)
    if (params()[i].grad().defined()) active.push_back(i);
  if (active.empty()) return;
  for (size_t i : active) check_state_matches(i);

  // The kernels' contract is one device, one dtype and one set of hyperparameters per call:
  // one call per (device, dtype, group weight decay), in the order the triples first appear
  // in the parameter list. Updates are elementwise, so the grouping changes no bits.
  std::vector<std::tuple<Device, DType, std::optional<double>>> keys;
  std::vector<StepGroup> groups;
  for (size_t i : active) {
    const Tensor& p = params()[i];
    const std::tuple<Device, DType, std::optional<double>> key{p.device(), p.dtype(), weight_decay_[i]};
    const size_t g = std::find(keys.begin(), keys.end(), key) - keys.begin();
    if (g == keys.size()) {
      keys.push_back(key);
      StepGroup& group = groups.emplace_back();
      group.device = p.device();
      group.weight_decay = weight_decay_[i];
    }
    StepGroup& group = groups[g];
    group.index.push_back(i);
    // A strided parameter (rare: a leaf made from a view) is updated in a contiguous
    // copy and written back.
    group.params.push_back(p.is_contiguous() ? p.detach() : p.detach().contiguous());
    group.grads.push_back(p.grad().contiguous());
  }
  for (const StepGroup& group : groups) {
    update(group);
    for (size_t k = 0; k < group.index.size(); ++k) {
      const Tensor& p = params()[group.index[k]];
      if (p.is_contiguous())
        p.bump_version();
      else
        p.copy_(group.params[k]);
    }
  }
}

OptimizerState MultiTensorOptimizer::state_dict() const {
  OptimizerState out;
  for (size_t i = 0; i < params().size(); ++i) {
    for (size_t s = 0; s < slot_names_.size(); ++s)
      if (state_[i].slots[s].defined())
        out.tensors.emplace_back(std::to_string(i) + "." + slot_names_[s], state_[i].slots[s].detach());
    if (counts_steps_ && state_[i].step > 0)
      out.scalars[std::to_string(i) + ".step"] = static_cast<double>(state_[i].step);
    if (weight_decay_[i]) out.scalars[std::to_string(i) + ".weight_decay"] = *weight_decay_[i];
  }
  out.scalars.merge(hyperparameters());
  out.scalars["lr"] = lr();
  out.scalars["num_params"] = static_cast<double>(params().size());
  if (initial_lr()) out.scalars["initial_lr"] = *initial_lr();
  return out;
}

void MultiTensorOptimizer::load_state_dict(const OptimizerState& state) {
  const std::string where = name() + ".load_state_dict";
  const auto& scalars = state.scalars;

  // 1. The parameter count, then the scalar keys, which say which optimizer type saved
  // the state.
  if (auto count = scalars.find("num_params"); count != scalars.end())
    WEFT_CHECK(count->second == static_cast<double>(params().size()), where, ": the state holds ", count->second,
               " parameters but this optimizer has ", params().size());
  std::map<std::string, double> expected = hyperparameters();
  expected["lr"] = 0;
  expected["num_params"] = 0;
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, value] : expected)
    if (!scalars.count(key)) missing.push_back(key);
  std::vector<int64_t> steps(params().size(), 0);
  std::vector<std::optional<double>> decays(params().size());
  for (const auto& [key, value] : scalars) {
    if (expected.count(key) || key == "initial_lr") continue;
    const size_t dot = key.find('.');
    const std::optional<size_t> index = dot == std::string::npos ? std::nullopt : parse_index(key.substr(0, dot));
    const std::string what = index ? key.substr(dot + 1) : "";
    if (index && ((counts_steps_ && what == "step") || what == "weight_decay")) {
      const size_t i = *index;
      WEFT_CHECK(i < params().size(), where, ": scalar '", key, "' names parameter ", i, " but this optimizer has ",
                 params().size(), " parameters");
      if (what == "step") {
        WEFT_CHECK(value >= 0 && value == std::floor(value) && value < 9.0e15, where, ": scalar '", key,
                   "' must be a non-negative whole number, got ", value);
        steps[i] = static_cast<int64_t>(value);
      } else {
        WEFT_CHECK(value >= 0, where, ": scalar '", key, "' (a weight decay) must be >= 0, got ", value);
        decays[i] = value;
      }
      continue;
    }
    unexpected.push_back(key);
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::string problems = missing.empty() ? "" : "missing " + join(missing);
    if (!unexpected.empty()) problems += (problems.empty() ? "" : "; ") + std::string("unexpected ") + join(unexpected);
    WEFT_FAIL(where, ": the state was not saved by ", name(), " (scalars: ", problems, ")");
  }
  double lr = scalars.at("lr");
  check_hyperparameter(lr >= 0, "learning rate", lr, "must be >= 0");
  check_hyperparameters(scalars);
  // The groups: a parameter has a weight decay of its own in the state exactly where its group
  // sets one here. The values are the state's, as every hyperparameter is.
  for (size_t i = 0; i < params().size(); ++i) {
    const std::string key = std::to_string(i) + ".weight_decay";
    WEFT_CHECK(!decays[i] || weight_decay_[i], where, ": the state gives parameter ", i,
               " a weight decay of its own (scalar '", key, "' = ", decays[i].value_or(0),
               ") but here its group sets none (it decays by the optimizer's weight_decay); build the optimizer "
               "over the parameter groups of the one that saved the state");
    WEFT_CHECK(decays[i] || !weight_decay_[i], where, ": parameter ", i, "'s group sets a weight decay (",
               weight_decay_[i].value_or(0), ") but the state has no scalar '", key,
               "' (the optimizer that saved it decayed parameter ", i,
               " by its weight_decay); build the optimizer over the parameter groups of the one that saved the state");
  }

  // 2. Tensors: "<index>.<slot>", each shaped like its parameter; copied onto the
  // parameter's device and dtype.
  std::vector<ParamState> loaded(params().size());
  for (size_t i = 0; i < params().size(); ++i) {
    loaded[i].step = steps[i];
    loaded[i].slots.resize(slot_names_.size());
  }
  NoGradGuard no_grad;
  for (const auto& [key, value] : state.tensors) {
    size_t dot = key.find('.');
    std::optional<size_t> index = dot == std::string::npos ? std::nullopt : parse_index(key.substr(0, dot));
    std::string slot_name = dot == std::string::npos ? "" : key.substr(dot + 1);
    auto slot = std::find(slot_names_.begin(), slot_names_.end(), slot_name);
    WEFT_CHECK(index && slot != slot_names_.end(), where, ": unexpected tensor '", key, "' (", name(),
               " state tensors are named '<param index>.<name>' with name one of: ", join(slot_names_), ")");
    WEFT_CHECK(*index < params().size(), where, ": tensor '", key, "' names parameter ", *index,
               " but this optimizer has ", params().size(), " parameters");
    const Tensor& p = params()[*index];
    WEFT_CHECK(value.defined(), where, ": tensor '", key, "' is undefined");
    WEFT_CHECK(value.shape() == p.shape(), where, ": tensor '", key, "' has shape ", value.shape(), " but parameter ",
               *index, " has shape ", p.shape());
    WEFT_CHECK(is_floating(value.dtype()), where, ": tensor '", key, "' has dtype ", value.dtype(),
               " (expected a floating dtype)");
    Tensor& target = loaded[*index].slots[slot - slot_names_.begin()];
    WEFT_CHECK(!target.defined(), where, ": tensor '", key, "' appears twice");
    target = empty(p.shape(), TensorOptions(p.dtype(), p.device()));
    target.copy_(value.detach());
  }
  check_state(loaded, scalars);

  // 3. Everything checked: commit.
  set_hyperparameters(scalars);
  set_lr(lr);
  // A state saved before any scheduler existed keeps the current initial_lr.
  if (auto initial = scalars.find("initial_lr"); initial != scalars.end()) set_initial_lr(initial->second);
  state_ = std::move(loaded);
  weight_decay_ = std::move(decays);
}

}  // namespace weft::optim
