// Module: registration, traversal, device moves, state dicts, deep copies and replicas.
#include "nn/module.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/autograd.h"

namespace weft::nn {

void Module::check_new_name(const std::string& name) const {
  WEFT_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid name '", name,
             "' (names are non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  WEFT_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": the name '", name,
             "' is already registered");
}

const Tensor& Module::register_parameter(std::string name, Tensor value, bool requires_grad) {
  check_new_name(name);
  WEFT_CHECK(value.defined(), type_name_, ": parameter '", name, "' is an undefined tensor");
  Tensor leaf = value.is_leaf() ? value : value.detach();
  if (requires_grad && !leaf.requires_grad()) leaf.requires_grad_(true);
  params_.emplace_back(std::move(name), std::move(leaf));
  return params_.back().second;
}

const Tensor& Module::register_buffer(std::string name, Tensor value) {
  check_new_name(name);
  WEFT_CHECK(value.defined(), type_name_, ": buffer '", name, "' is an undefined tensor");
  buffers_.emplace_back(std::move(name), value.detach());
  return buffers_.back().second;
}

namespace {
template <class List>
auto find_entry(const List& list, std::string_view name) {
  return std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
}
}  // namespace

const Tensor& Module::param(std::string_view name) const {
  auto it = find_entry(params_, name);
  WEFT_CHECK(it != params_.end(), type_name_, " has no parameter '", name, "'");
  return it->second;
}

bool Module::has_param(std::string_view name) const { return find_entry(params_, name) != params_.end(); }

const Tensor& Module::buffer(std::string_view name) const {
  auto it = find_entry(buffers_, name);
  WEFT_CHECK(it != buffers_.end(), type_name_, " has no buffer '", name, "'");
  return it->second;
}

Module& Module::child(std::string_view name) const {
  auto it = find_entry(children_, name);
  WEFT_CHECK(it != children_.end(), type_name_, " has no child module '", name, "'");
  return *it->second;
}

void Module::replace_child(std::string_view name, std::shared_ptr<Module> module) {
  auto it = std::find_if(children_.begin(), children_.end(), [&](const auto& e) { return e.first == name; });
  WEFT_CHECK(it != children_.end(), type_name_, " has no child module '", name, "' to replace");
  WEFT_CHECK(module != nullptr, type_name_, ": replace_child('", name, "') was given a null module");
  it->second = std::move(module);
}

void Module::collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out,
                     std::unordered_set<const TensorImpl*>& seen) const {
  for (const auto& [name, t] : params ? params_ : buffers_)
    if (seen.insert(t.impl()).second) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, c] : children_) c->collect(prefix + name + ".", true, params, out, seen);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  collect("", recurse, true, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  collect("", recurse, false, out, seen);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out{{"", this}};
  for (const auto& [name, c] : children_)
    for (auto& [sub, m] : c->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, c] : children_) c->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  // Parameters change in place: a tied one moves where it is first met and then needs nothing.
  for (auto& [name, p] : params_)
    if (p.device() != device) p.set_data(p.to(device));  // in place: nothing to do, .grad stays
  for (auto& [name, b] : buffers_) b = b.to(device);
  for (auto& [name, c] : children_) c->to(device);
}

void Module::to(DType dtype) {
  WEFT_CHECK(is_floating(dtype), type_name_, ".to: modules convert to floating dtypes only, got ", dtype);
  NoGradGuard no_grad;
  for (auto& [name, p] : params_)
    if (is_floating(p.dtype()) && p.dtype() != dtype) p.set_data(p.to(dtype));
  for (auto& [name, b] : buffers_)
    if (is_floating(b.dtype())) b = b.to(dtype);
  for (auto& [name, c] : children_) c->to(dtype);
}

Device Module::device() const {
  auto params = named_parameters();
  if (!params.empty()) return params.front().second.device();
  auto buffers = named_buffers();
  return buffers.empty() ? kCPU : buffers.front().second.device();
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  for (auto& entry : named_buffers()) out.push_back(std::move(entry));
  for (auto& [name, t] : out) t = t.detach();
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;
  std::vector<std::string> missing, mismatched;
  NamedTensors own = named_parameters();
  for (auto& entry : named_buffers()) own.push_back(entry);
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    if (!it->second->defined() || it->second->shape() != t.shape())
      mismatched.push_back(name + " (checkpoint " + (it->second->defined() ? it->second->shape().str() : "undefined") +
                           ", model " + t.shape().str() + ")");
    given.erase(it);
  }
  std::ostringstream problems;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    problems << (problems.tellp() > 0 ? "; " : "") << what << ": ";
    for (size_t i = 0; i < names.size(); ++i) problems << (i ? ", " : "") << names[i];
  };
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : given) unexpected.push_back(name);
  list("shape mismatch", mismatched);
  if (strict) {
    list("missing keys", missing);
    list("unexpected keys", unexpected);
  }
  WEFT_CHECK(problems.tellp() == 0, "load_state_dict for ", type_name_, ": ", problems.str());
  NoGradGuard no_grad;
  for (const auto& entry : own) {  // not a structured binding: Clang 14 cannot capture one
    auto src = std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == entry.first; });
    if (src != state.end()) entry.second.copy_(src->second);
  }
}

std::shared_ptr<Module> Module::clone(std::optional<Device> device) const {
  std::unordered_map<const TensorImpl*, Tensor> copies;
  return clone_into(device, copies);
}

// `copies` maps each original tensor to its copy, so that a tied tensor is copied once.
std::shared_ptr<Module> Module::clone_into(std::optional<Device> device,
                                           std::unordered_map<const TensorImpl*, Tensor>& copies) const {
  std::shared_ptr<Module> copy = shallow_copy();
  NoGradGuard no_grad;
  // A fresh copy, on `device` if one was given, else where the original lives.
  auto fresh = [&](const Tensor& t) { return device && *device != t.device() ? t.to(*device) : t.clone(); };
  for (auto& [name, p] : copy->params_) {
    auto [it, is_new] = copies.try_emplace(p.impl());
    if (is_new) {
      it->second = fresh(p.detach());
      if (p.requires_grad()) it->second.requires_grad_(true);
    }
    p = it->second;
  }
  for (auto& [name, b] : copy->buffers_) {
    auto [it, is_new] = copies.try_emplace(b.impl());
    if (is_new) it->second = fresh(b);
    b = it->second;
  }
  for (auto& [name, c] : copy->children_) c = c->clone_into(device, copies);
  return copy;
}

namespace {

std::string describe(const Tensor& t) {
  std::ostringstream out;
  out << t.dtype() << " " << t.shape();
  return out.str();
}

// Checks `given` against `own` (named_parameters() or named_buffers()) one by one.
void check_replica_tensors(const std::string& type_name, const char* what, const NamedTensors& own,
                           std::span<const Tensor> given) {
  WEFT_CHECK(given.size() == own.size(), type_name, ".replica: got ", given.size(), " ", what, "s but the module has ",
             own.size(), " (one per entry of named_", what, "s(), in that order); ",
             given.size() < own.size() ? "the first one missing is '" + own[given.size()].first + "'"
                                       : "the extra ones start at index " + std::to_string(own.size()));
  for (size_t i = 0; i < own.size(); ++i) {
    const auto& [name, mine] = own[i];
    WEFT_CHECK(given[i].defined(), type_name, ".replica: ", what, " ", i, " ('", name, "') is an undefined tensor");
    WEFT_CHECK(given[i].shape() == mine.shape() && given[i].dtype() == mine.dtype(), type_name, ".replica: ", what,
               " ", i, " ('", name, "') is ", describe(given[i]), " but the module's is ", describe(mine));
  }
}

}  // namespace

std::shared_ptr<Module> Module::replica(std::span<const Tensor> parameters, std::span<const Tensor> buffers) const {
  const NamedTensors own_params = named_parameters(), own_buffers = named_buffers();
  check_replica_tensors(type_name_, "parameter", own_params, parameters);
  check_replica_tensors(type_name_, "buffer", own_buffers, buffers);
  std::unordered_map<const TensorImpl*, Tensor> given;
  for (size_t i = 0; i < own_params.size(); ++i) given.emplace(own_params[i].second.impl(), parameters[i]);
  for (size_t i = 0; i < own_buffers.size(); ++i) given.emplace(own_buffers[i].second.impl(), buffers[i]);
  return replica_from(given);
}

std::shared_ptr<Module> Module::replica_from(const std::unordered_map<const TensorImpl*, Tensor>& given) const {
  // The copy constructor behind shallow_copy() keeps the configuration and training_.
  std::shared_ptr<Module> copy = shallow_copy();
  for (auto& [name, p] : copy->params_) p = given.at(p.impl());
  for (auto& [name, b] : copy->buffers_) b = given.at(b.impl());
  for (auto& [name, c] : copy->children_) c = c->replica_from(given);
  return copy;
}

std::string Module::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

void Module::repr_into(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (children_.empty()) {
    out += ")";
    return;
  }
  out += "\n";
  for (const auto& [name, c] : children_) {
    out += std::string(indent + 2, ' ') + "(" + name + "): ";
    c->repr_into(out, indent + 2);
    out += "\n";
  }
  out += std::string(indent, ' ') + ")";
}

}  // namespace weft::nn
