// Module: the tree of layers that owns parameters and buffers (PyTorch's nn.Module).
//
// A module registers its parameters, buffers and children by name in its constructor and
// reads them back by name in forward(): `linear(x, param("weight"), param("bias"))`.
// Keeping every tensor and child in the registry (and none in typed members) is what
// makes the generic operations exact: clone() deep-copies a tree into new, independent
// leaves (a second model with the same weights); replica() makes a shallow copy whose
// slots hold tensors the caller gives, possibly non-leaf (the building block of
// parallel::replicate for DataParallel, see Note [Replicas]); to() moves every tensor;
// state_dict() sees everything. Derived classes therefore must not keep Tensor or child
// handles of their own.
//
// Note [Tied parameters]: one parameter may be registered in two modules (a GPT's output
// projection is its token embedding's weight). The tree then holds it once: the traversals
// (named_parameters, state_dict) list each tensor under the first name that reaches it (a
// module's own entries before its children's), as PyTorch's
// named_parameters(remove_duplicate=True) does, so an optimizer or a gradient all-reduce sees
// it once; clone() gives the copy one new tensor in both places, replica() takes one tensor per
// listed entry and puts it in both, and to() converts it in place once. A checkpoint therefore
// holds a tied parameter under its first name only. (A buffer cannot be tied:
// register_buffer keeps a detached alias, a tensor of its own.)
//
// Note [Replicas]: forward() reads its tensors from the registry at every call, so a
// replica computes with exactly the tensors it was given: when they are the outputs of
// a differentiable copy of the original's parameters (e.g. p.to(cuda:1)), backward
// through the replica accumulates into the original parameters' .grad. A layer that
// updates a buffer must do so in place on the buffer tensor, never by re-registering
// or reassigning the slot (BatchNorm2d's running stats and num_batches_tracked are
// updated in place), so that a replica given the original's buffer tensors (replica 0
// of DataParallel, as in PyTorch) updates the original's statistics.
//
// Modules are held by std::shared_ptr; a concrete module derives from
// Cloneable<Itself>, which supplies the copy that clone() starts from.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace weft::nn {

class Sequential;

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;

  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }

  const std::string& type_name() const { return type_name_; }
  // The configuration in one line, e.g. "in_features=784, out_features=10, bias=true".
  virtual std::string extra_repr() const { return ""; }
  // The whole tree, printed as PyTorch prints a module.
  std::string repr() const;
  // The same layers (shared, not copied) as a Sequential that computes the same function,
  // with this model's state_dict names: the form a pipeline splits into stages. Null where the
  // model's forward is not its layers applied one after the other.
  virtual std::shared_ptr<Sequential> as_sequential() const { return nullptr; }

  // --- the tree ---------------------------------------------------------------------
  // Dotted names ("layer1.0.conv1.weight"), registration order, parents before children.
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // This module ("") and every descendant, depth first.
  std::vector<std::pair<std::string, const Module*>> named_modules() const;

  // This module's own entries; a missing name is an error naming the module's type.
  const Tensor& param(std::string_view name) const;
  const Tensor& buffer(std::string_view name) const;
  bool has_param(std::string_view name) const;
  Module& child(std::string_view name) const;
  template <class M>
  M& child_as(std::string_view name) const;
  // Puts `module` in the slot of the existing child `name`, keeping its place in the order
  // (what a conversion such as parallel::SyncBatchNorm::convert does; PyTorch sets the
  // attribute). forward() reads children by name, so the next call uses the new one.
  void replace_child(std::string_view name, std::shared_ptr<Module> module);

  // --- state ------------------------------------------------------------------------
  void train(bool on = true);  // recursive, as in PyTorch
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer, keeping the parameters' identities (handles held
  // by an optimizer stay valid); grads are dropped.
  void to(Device device);
  void to(DType dtype);  // floating parameters and buffers only, as PyTorch
  // The device of the first parameter or buffer (cpu:0 for a module without tensors).
  Device device() const;
  // Sets every parameter's gradient to none (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  // Parameters then buffers of every module, by dotted name; detached aliases.
  NamedTensors state_dict() const;
  // Copies values in. With strict, missing and unexpected names are errors; a shape
  // mismatch always is. One error lists every problem found.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // A deep copy of the whole tree (on `device` if given): new leaves with the same
  // values and requires_grad, same training mode. Gradients of the copy never reach the
  // original.
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const;
  // A shallow copy of the whole tree (PyTorch's Module._replicate_for_data_parallel):
  // the same module types, configuration and training mode, each parameter slot holding
  // parameters[i] and each buffer slot buffers[j], in named_parameters() /
  // named_buffers() order. The tensors are stored exactly as given (not detached,
  // requires_grad untouched), so they may be non-leaf; see Note [Replicas]. Counts,
  // shapes and dtypes must match this module's (an error names the parameter or buffer);
  // devices are the caller's choice. A replica is for forward and backward: to(),
  // load_state_dict() and zero_grad() on it act on the given tensors.
  std::shared_ptr<Module> replica(std::span<const Tensor> parameters, std::span<const Tensor> buffers) const;

 protected:
  const Tensor& register_parameter(std::string name, Tensor value, bool requires_grad = true);
  const Tensor& register_buffer(std::string name, Tensor value);
  template <class M>
  M& register_module(std::string name, std::shared_ptr<M> module) {
    check_new_name(name);
    M& ref = *module;
    children_.emplace_back(std::move(name), std::move(module));
    return ref;
  }
  // A copy that shares tensors and children with this one; clone() and replica() then
  // replace them.
  virtual std::shared_ptr<Module> shallow_copy() const = 0;
  // The same shallow copy under another type name: for a derived layer made from an
  // existing one, holding its very tensors (parallel::SyncBatchNorm::convert).
  Module(const Module& other, std::string type_name) : Module(other) { type_name_ = std::move(type_name); }

 private:
  void check_new_name(const std::string& name) const;
  // Appends prefix + name for each tensor not in `seen` yet (Note [Tied parameters]).
  void collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out,
               std::unordered_set<const TensorImpl*>& seen) const;
  std::shared_ptr<Module> clone_into(std::optional<Device> device,
                                     std::unordered_map<const TensorImpl*, Tensor>& copies) const;
  void repr_into(std::string& out, int indent) const;
  // replica() after its checks: fills each slot with the tensor given for its original.
  std::shared_ptr<Module> replica_from(const std::unordered_map<const TensorImpl*, Tensor>& given) const;

  std::string type_name_;
  bool training_ = true;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

template <class Derived>
class Cloneable : public Module {
 public:
  using Module::Module;

 protected:
  std::shared_ptr<Module> shallow_copy() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

template <class M>
M& Module::child_as(std::string_view name) const {
  Module& m = child(name);
  auto* typed = dynamic_cast<M*>(&m);
  WEFT_CHECK(typed != nullptr, type_name_, ": child '", name, "' is a ", m.type_name(), ", not the type asked for");
  return *typed;
}

}  // namespace weft::nn
