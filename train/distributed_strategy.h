// DistributedStrategy: the TrainLoop's 'ddp' mode (seed 000's gpu_mode='ddp').
//
// One process per device, each running this same loop: the process joins the job's default
// group (init_process_group from the launcher's variables, unless the program joined one
// already), moves the model to its device (cuda:LOCAL_RANK with GPUs, else the CPU) and wraps
// it in DistributedDataParallel (after SyncBatchNorm::convert, with sync_batch_norm), with
// comm_hook's communication hook; the loaders are replaced by loaders over the same data
// with a DistributedSampler (training: every rank a disjoint share of each epoch, reshuffled
// by set_epoch) or a DistributedEvalSampler (evaluation: every test sample counted exactly
// once); the epoch's sums are all-reduced, so every rank reports the whole run's loss and
// accuracy; only rank 0 logs, writes metrics and checkpoints. The processes are started by
// weft-run (or torchrun-style variables, srun, mpirun); weft-train --mode ddp --nproc N
// starts them itself through weft-run (train/launch.h).
//
// Note [Local SGD in the TrainLoop]: with local_sgd_period P, the first local_sgd_warmup
// steps are plain DDP's; after them each rank steps on its own gradients (the post-local SGD
// hook with no gradient all-reduce, parallel/post_localsgd_hook.h) and the replicas'
// parameters are averaged after every P-th step (parallel::PeriodicModelAverager, counted
// from the warm-up's end, as PyTorch's PostLocalSGDOptimizer does). Between averages the
// replicas differ, and so do their optimizers' states (momentum, Adam's moments), which
// PyTorch never averages. Where the loop needs one model (the epoch's evaluation, rank 0's
// checkpoint) consolidate_replicas averages them all, once local steps have been taken:
// parameters, floating buffers (each rank's running statistics since its last forward) and
// optimizer state. A checkpoint then holds the whole job, and resuming from it, on any number
// of ranks, goes on as the uninterrupted run does, which consolidates at the same points. So
// the run depends on checkpoint_every (one more average per checkpoint), not on whether the
// checkpoints are written. The step count is saved as "strategy.local_sgd_step".
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/distributed_data_parallel.h"
#include "parallel/model_averaging.h"
#include "parallel/post_localsgd_hook.h"
#include "parallel/process_group.h"
#include "train/strategy.h"

namespace weft::train {

struct DistributedStrategyOptions {
  std::optional<Device> device;  // default: cuda:LOCAL_RANK when there is a GPU, else cpu
  parallel::DDPOptions ddp;
  // Every BatchNorm2d of the model becomes a parallel::SyncBatchNorm over the group before
  // DDP wraps it (PyTorch's convert_sync_batchnorm): the statistics of the whole job's batch.
  bool sync_batch_norm = false;
  // The DDP communication hook, by name (parallel::comm_hook_named): allreduce, fp16, bf16.
  std::string comm_hook = "allreduce";
  std::string backend;  // default: nccl for CUDA devices, gloo for the CPU
  // Local SGD (Note [Local SGD in the TrainLoop]): 0, plain DDP; P >= 1, the replicas averaged
  // every P steps after local_sgd_warmup steps of DDP. It brings its own communication hook
  // (comm_hook stays "allreduce"), and its optimizer must step each replica on its own: not
  // a ZeroRedundancyOptimizer, nor a PostLocalSGDOptimizer (which would average again).
  int64_t local_sgd_period = 0;
  int64_t local_sgd_warmup = 0;
};

class DistributedStrategy final : public Strategy {
 public:
  explicit DistributedStrategy(DistributedStrategyOptions options = {});

  ParallelMode mode() const override { return ParallelMode::DistributedDataParallel; }
  int world_size() const override { return group_->size(); }
  int rank() const override { return group_->rank(); }
  std::shared_ptr<nn::Module> prepare(std::shared_ptr<nn::Module> model) override;
  Device input_device() const override { return device_; }
  std::shared_ptr<data::DataLoader> shard(std::shared_ptr<data::DataLoader> loader, bool training) override;
  Tensor train_step(nn::Module& model, const data::Batch& batch, const Criterion& criterion,
                    optim::Optimizer& optimizer) override;
  Totals reduce(const Totals& local) override;
  void barrier() override;
  void consolidate_replicas(optim::Optimizer& optimizer) override;
  std::map<std::string, double> state_dict() const override;
  void check_state_dict(const std::map<std::string, double>& state) const override;
  void load_state_dict(const std::map<std::string, double>& state) override;

  parallel::DistributedDataParallel& ddp() const;
  // Local SGD's steps so far (0 without it): the averager's count, which the hook's follows.
  int64_t local_sgd_step() const { return averager_ ? averager_->step() : 0; }

 private:
  // Throws when `optimizer` cannot train local SGD's replicas (see the options).
  void check_local_sgd_optimizer(const optim::Optimizer& optimizer) const;

  DistributedStrategyOptions options_;
  Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;
  std::shared_ptr<parallel::DistributedDataParallel> ddp_;
  // Local SGD (null without it): the hook's state and the averager, and the parameters it averages.
  std::shared_ptr<parallel::PostLocalSGDState> local_sgd_;
  std::unique_ptr<parallel::PeriodicModelAverager> averager_;
  std::vector<Tensor> params_;
};

}  // namespace weft::train
