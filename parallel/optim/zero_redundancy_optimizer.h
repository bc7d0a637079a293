// ZeroRedundancyOptimizer: optimizer state sharded over the ranks of a data-parallel job
// (PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer; ZeRO stage 1, Rajbhandari
// et al. 2020).
//
// Under DDP every rank holds the same averaged gradients and would make the same update,
// and each keeps a full copy of the optimizer's state: for Adam, twice the parameters'
// bytes. Here each parameter is owned by one rank, which alone keeps its state and updates
// it; step() then broadcasts every parameter from its owner, so every replica ends with
// the same weights, bit for bit those a plain optimizer gives (the updates are elementwise,
// nn/optim/multi_tensor_optimizer.h). The state takes about 1 / world_size of the memory,
// at the price of one broadcast of the parameters per step.
//
//   auto ddp = std::make_shared<DistributedDataParallel>(model, group);
//   ZeroRedundancyOptimizer optimizer(model->parameters(), [](std::vector<Tensor> shard) {
//     return std::make_shared<optim::Adam>(std::move(shard), optim::AdamOptions{.lr = 1e-3});
//   }, group);
//   ... loss.backward(); optimizer.step(); ...
//
// With parameter groups (nn/optim/param_group.h: nanoGPT's weight-decay split), give it
// params_of(groups) and build each shard's optimizer over restrict_groups(groups, shard): each
// parameter keeps its group's decay, and the indices of the state are those of a plain
// optimizer over the same groups (its "<i>.weight_decay" entries included).
//
// The partition is PyTorch's: parameters sorted by size, largest first (ties in their
// order), each given to the rank that owns the fewest elements so far (ties: the lowest
// rank). A rank that owns nothing (more ranks than parameters) takes part in the broadcasts
// only. Every rank must give the same parameters in the same order (checked at
// construction).
//
// Checkpoints: consolidate_state_dict(to) gathers the shards on rank `to` (every rank calls
// it; the TrainLoop does before each checkpoint), whose state_dict() then returns the state
// a plain optimizer of the same kind over all the parameters would hold, with the same
// names. load_state_dict() takes such a state on every rank, each keeping its own shard: a
// checkpoint moves between plain and sharded training and between world sizes.
//
// Uneven inputs: join({ddp.get(), &optimizer}, body) (parallel/process_group/join.h). A rank that ran out
// steps its shard after each backward of the others that reduced (DDP's join hook says which),
// on the averaged gradients that hook leaves; so the body steps after each backward that
// reduces (after every one, or after the last micro-batch accumulated under no_sync).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/optim/optimizer.h"
#include "parallel/process_group/join.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

// Makes the optimizer over the parameters it is given: this rank's shard (on a rank that owns
// none, once over all of them, dropped at once: what the wrapper learns its name and rate from).
using ShardOptimizerFactory = std::function<std::shared_ptr<optim::Optimizer>(std::vector<Tensor> shard)>;

class ZeroRedundancyOptimizer final : public optim::Optimizer, public Joinable {
 public:
  // `group`: the data-parallel group (null: the default group). The parameters must share
  // one device; the factory's optimizer takes this one's name ("ZeroRedundancyOptimizer(Adam)")
  // and learning rate.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, ShardOptimizerFactory make_shard_optimizer,
                          std::shared_ptr<ProcessGroup> group = nullptr);

  // The shard's update, then every parameter broadcast from its owner. Every rank calls it.
  void step() override;
  optim::StepScope step_scope() const override { return optim::StepScope::ShardedAcrossRanks; }
  // A collective: rank `to` receives every rank's shard of the state (kept on the CPU).
  void consolidate_state_dict(int to = 0) override;
  // On the rank of the last consolidate_state_dict(), with no step() since: the whole
  // state, in the form of the shard optimizer's (nn/optim/optimizer.h). Anywhere else, an
  // error saying what to call.
  optim::OptimizerState state_dict() const override;
  // A whole state, as state_dict() returns or the shard optimizer's kind saves over all the
  // parameters; every rank loads its own shard. A collective: when one rank's shard refuses
  // the state, every rank throws (naming that rank) and keeps its state as it was.
  void load_state_dict(const optim::OptimizerState& state) override;

  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  Device join_device() const override { return device_; }
  ProcessGroup& join_process_group() const override { return *group_; }

  // The rank that updates params()[i], for every i.
  const std::vector<int>& owners() const { return owner_; }
  // This rank's optimizer (null when it owns no parameter); its parameter k is params()[owned()[k]].
  optim::Optimizer* shard_optimizer() const { return shard_.get(); }
  const std::vector<size_t>& owned() const { return owned_; }

 private:
  // What construction decides before the base class is made: the partition, and the shard
  // optimizer that gives this one its name and rate.
  struct Plan {
    std::vector<Tensor> params;
    std::shared_ptr<ProcessGroup> group;
    Device device;
    std::vector<int> owner;
    std::vector<size_t> owned;
    std::shared_ptr<optim::Optimizer> shard;
    ShardOptimizerFactory make_shard_optimizer;
    std::string name;
    double lr = 0;

    static Plan make(std::vector<Tensor> params, ShardOptimizerFactory make_shard_optimizer,
                     std::shared_ptr<ProcessGroup> group);
  };
  explicit ZeroRedundancyOptimizer(Plan plan);

  void update_and_sync();  // step() without the join's announcement
  void sync_params();
  class StepWhileJoined;   // the join hook

  std::shared_ptr<ProcessGroup> group_;
  Device device_;
  std::vector<int> owner_;
  std::vector<size_t> owned_;
  std::shared_ptr<optim::Optimizer> shard_;
  ShardOptimizerFactory make_shard_optimizer_;  // load_state_dict loads into a new shard optimizer first
  // The last consolidation's result on its `to` rank, and the step count it belongs to.
  std::optional<optim::OptimizerState> consolidated_;
  int64_t steps_ = 0, consolidated_at_ = -1;
};

}  // namespace weft::parallel
