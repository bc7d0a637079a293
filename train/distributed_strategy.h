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
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "parallel/distributed_data_parallel.h"
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
  Totals reduce(const Totals& local) override;
  void barrier() override;

  parallel::DistributedDataParallel& ddp() const;

 private:
  DistributedStrategyOptions options_;
  Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;
  std::shared_ptr<parallel::DistributedDataParallel> ddp_;
};

}  // namespace weft::train
