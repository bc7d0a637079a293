// DistributedDataParallel: one model replica per process, gradients averaged across the
// processes during backward (PyTorch's torch.nn.parallel.DistributedDataParallel).
//
//   parallel::init_process_group("gloo");
//   auto model = std::make_shared<nn::ConvNet>();
//   auto ddp = std::make_shared<parallel::DistributedDataParallel>(model);  // the default group
//   optim::SGD sgd(model->parameters(), {0.01, 0.9});
//   // each rank: its own shard of every batch (data::DistributedSampler)
//   cross_entropy((*ddp)(images), labels).backward();  // gradients now averaged over the ranks
//   sgd.step();                                         // every rank takes the same step
//
// At construction every rank's parameters must have the same names, shapes and dtypes (an
// error names the first that differs and the ranks), and rank 0's parameters and buffers
// are broadcast to the others, so every replica starts equal. Each forward with grad mode on
// broadcasts rank 0's buffers first (broadcast_buffers: BatchNorm's running statistics stay
// equal; in a join, the buffers of the highest rank still iterating; evaluation forwards do
// not, since the ranks' evaluation shards may differ in length, and a collective in unequal
// numbers of forwards would hang) and readies the Reducer (parallel/ddp/reducer.h), whose hooks
// launch each bucket's all-reduce as soon as its gradients are in, overlapping
// communication with the rest of backward.
// no_sync() skips the reduction: gradients accumulate locally, and the next synchronised
// backward reduces the sum (gradient accumulation over several micro-batches).
//
// register_comm_hook replaces the bucket's all-reduce: parallel/ddp/comm_hooks.h has the
// built-ins (allreduce, fp16 and bf16 compression) and says how to write one;
// parallel/ddp/powersgd_hook.h has PowerSGD's.
//
// Uneven inputs: join() (parallel/process_group/join.h) lets ranks with fewer batches shadow the others'
// collectives until every rank has run out; afterwards every rank holds the model of the
// ranks that ran out last. While shadowing, a rank's gradients hold each shadowed
// iteration's averages (PyTorch leaves them as they were), so that a ZeroRedundancyOptimizer
// in the same join steps its shard on the gradients the others step on.
//
// Where weft differs from PyTorch: one input tensor per forward (as nn::Module).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "nn/module.h"
#include "parallel/ddp/reducer.h"
#include "parallel/process_group/join.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

struct DDPOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool broadcast_buffers = true;
};

class DistributedDataParallel : public nn::Cloneable<DistributedDataParallel>, public Joinable {
 public:
  // group: null means the default group (parallel/process_group/distributed.h).
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group = nullptr,
                                   DDPOptions options = {});
  DistributedDataParallel(const DistributedDataParallel& other);  // a shallow copy (clone); it gets no reducer

  Tensor forward(const Tensor& input) override;

  nn::Module& module() const { return child("module"); }
  ProcessGroup& process_group() const { return *group_; }
  Reducer& reducer() const;
  const DDPOptions& options() const { return options_; }
  void register_comm_hook(CommHook hook) { reducer().set_comm_hook(std::move(hook)); }
  std::string extra_repr() const override;

  // Runs `body` (a training loop over this rank's inputs) inside a join of this module alone:
  // parallel::join({this}, body, options).
  void join(const std::function<void()>& body, const JoinOptions& options = {});
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  Device join_device() const override { return device_; }
  ProcessGroup& join_process_group() const override { return *group_; }

  // While alive, forward and backward skip the reduction (PyTorch's `with ddp.no_sync():`).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.require_sync_) { ddp.require_sync_ = false; }
    ~NoSync() { ddp_.require_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

 private:
  void check_same_parameters_on_every_rank() const;
  void broadcast_from(const std::vector<Tensor>& tensors, int root) const;
  bool syncs_buffers() const;
  // Inside a join: the highest rank among those whose `candidate` is true (a collective).
  int highest_rank_where(bool candidate) const;
  // Inside a join, each training forward tells the ranks that ran out whether its backward
  // reduces (one all-reduce: the sum of the ranks' answers, 0 from those that ran out).
  void announce_whether_backward_reduces(bool reduces) const;
  bool backward_reduces_elsewhere() const;  // on a rank that ran out

  class ShadowingHook;  // the join hook

  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  Device device_ = kCPU;  // the parameters' (the first one's): where the join's flags go
  std::shared_ptr<Reducer> reducer_;
  bool require_sync_ = true;
};

}  // namespace weft::parallel
