// Strategy: how the TrainLoop runs a model on its devices, without the loop knowing how.
//
// A loop that branches on a mode (gpu_mode = 'dp' or 'ddp') grows a branch per mode in every
// phase. weft's loop instead asks a Strategy, at a few fixed points, what only the mode knows:
// which devices the model runs on and where batches go, how the model is prepared (moved,
// wrapped in DataParallel or DDP, split into pipeline stages), how one batch is stepped, how a
// loader is sharded across processes, how the sums of an epoch (loss, correct answers,
// samples) are combined across devices or ranks, and whether this process logs, writes metrics
// and saves checkpoints. train_epoch, evaluate and save_checkpoint are the same for every
// mode.
//
// In one process: SingleDevice (below), the model runs where it lives; DataParallelStrategy
// (train/data_parallel_strategy.h), the batch split across devices; PipelineStrategy
// (train/pipeline_strategy.h), the model split into stages on devices. Across processes, one
// class for every combination: DistributedStrategy (train/distributed_strategy.h) applies each
// parallelism of a ParallelPlan (DDP, a stage per rank, both) along a dimension of one
// DeviceMesh.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "data/dataloader.h"
#include "nn/criterion.h"
#include "nn/module.h"
#include "nn/optim/optimizer.h"

namespace weft::train {

// weft-train's --mode and the metrics' "mode" (PyTorch's TrainLoop calls it gpu_mode).
enum class ParallelMode { Single, DataParallel, DistributedDataParallel, Pipeline };
// "single", "dp", "ddp", "pipeline".
ParallelMode parse_parallel_mode(const std::string& name);
const char* parallel_mode_name(ParallelMode mode);

using nn::Criterion;

// Sums over the batches of an epoch or an evaluation, read back once at its end.
struct Totals {
  double loss = 0;     // training: the sum of batch losses; evaluation: of per-sample losses
  double correct = 0;  // evaluation: outputs whose argmax is the target
  double samples = 0;
  double batches = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual ParallelMode mode() const = 0;
  // Devices (dp, pipeline) or processes (ddp) that share one step; metrics' world_size.
  virtual int world_size() const { return 1; }
  // This process's rank among them (0 but in ddp), and whether it is the one that logs,
  // writes metrics and checkpoints (rank 0).
  virtual int rank() const { return 0; }
  bool is_main_process() const { return rank() == 0; }

  // Called once, by the TrainLoop's constructor: checks, moves or wraps the model and
  // returns the module the loop calls forward on, which the strategy keeps (runner()). A
  // strategy serves one model: a second call is an error.
  std::shared_ptr<nn::Module> prepare(std::shared_ptr<nn::Module> model);
  // What prepare() returned (an error before it).
  nn::Module& runner() const;
  // Where the loop delivers batches (and sums the epoch's totals).
  virtual Device input_device() const = 0;
  // This process's share of a loader's samples (ddp, and a pipeline replicated over
  // data-parallel groups: shard_loader below over the ranks or replicas, so that every test
  // sample is counted once); others: the loader itself.
  virtual std::shared_ptr<data::DataLoader> shard(std::shared_ptr<data::DataLoader> loader, bool training) {
    return loader;
  }
  // One step on one batch: zero the grads, forward, loss, backward, optimizer step.
  // Returns the batch's loss on input_device(), not read back.
  virtual Tensor train_step(const data::Batch& batch, const Criterion& criterion, optim::Optimizer& optimizer);
  // The model's output for a batch being evaluated, on input_device() (the pipeline across
  // processes: the last stage's, broadcast to every rank).
  virtual Tensor forward(const Tensor& input) { return runner().forward(input); }
  // This process's totals combined over every process of the run (ddp: all-reduced).
  virtual Totals reduce(const Totals& local) { return local; }
  // Returns once every process of the run has called it (ddp: the group's barrier): after
  // a checkpoint, so that every rank's Callback::on_checkpoint finds rank 0's file complete.
  virtual void barrier() {}

  // Makes every process's copy of the model (parameters and floating buffers), and of the
  // optimizer's state, the whole run's: the loop calls it at each epoch's end (before
  // evaluating) and before each mid-epoch checkpoint, so that what is evaluated and what the
  // main process saves is the whole run's state. A no-op where the copies never part (ddp with
  // local SGD averages its replicas here, the pipeline across processes gathers its stages:
  // collectives).
  virtual void consolidate_replicas(optim::Optimizer& optimizer) {}
  // What the strategy keeps across a checkpoint (ddp with local SGD: its step count), saved
  // as "strategy.<key>" metadata. check_state_dict throws where load_state_dict would, and
  // changes nothing (resume checks everything before it loads anything); a strategy that
  // keeps nothing ignores the entries (a local-SGD run's checkpoint goes on as plain ddp, or
  // on one device).
  virtual std::map<std::string, double> state_dict() const { return {}; }
  virtual void check_state_dict(const std::map<std::string, double>& state) const {}
  virtual void load_state_dict(const std::map<std::string, double>& state) {}
  // The layers of each pipeline stage, in stage order, once prepare() has split the model;
  // empty where the model is not split.
  virtual std::vector<size_t> stage_layers() const { return {}; }

 protected:
  // prepare()'s work: what the mode does to the model.
  virtual std::shared_ptr<nn::Module> prepare_model(std::shared_ptr<nn::Module> model) = 0;

 private:
  std::shared_ptr<nn::Module> runner_;
};

// Shard `index` of `shards` of a loader's samples: a loader over the same data and options with
// a DistributedSampler when `training` (disjoint shares of each epoch, reshuffled by
// set_epoch), a DistributedEvalSampler otherwise (every sample counted exactly once). How ddp
// shards over its ranks and a replicated pipeline over its replicas.
std::shared_ptr<data::DataLoader> shard_loader(const data::DataLoader& loader, bool training, int shards, int index);

// The model runs on the device it is on; given a device, the model is moved there first.
class SingleDevice final : public Strategy {
 public:
  explicit SingleDevice(std::optional<Device> device = std::nullopt) : device_(device) {}

  ParallelMode mode() const override { return ParallelMode::Single; }
  Device input_device() const override;

 private:
  std::shared_ptr<nn::Module> prepare_model(std::shared_ptr<nn::Module> model) override;
  std::optional<Device> device_;
};

}  // namespace weft::train
