// DistributedStrategy: the TrainLoop across processes, one rank per device, every parallelism
// applied along a dimension of one DeviceMesh (parallel/mesh/). The options' ParallelPlan
// says how many ranks each takes; prepare() applies them in turn, and the loop's other
// questions (which share of the data, how the sums combine, what makes the replicas one model
// again) are answered per dimension:
//
//   dimension      prepare()                                  shard()      reduce()
//   pp             the model's Sequential split into stages   not sharded  checked equal
//   dp_replicate   DDP (alone), or each stage's gradients     sharded      summed
//                  averaged over its replicas (with pp)
//
// A new parallelism (dp_shard, tp) is a new row: a step in prepare() and its answers here, not a
// new class. weft-train --mode ddp is the plan {dp_replicate = every rank}; --mode pipeline is
// {pp = the rest, dp_replicate = --replicas}.
//
// Every rank runs this same loop: it joins the job's default group (init_process_group from
// the launcher's variables, unless the program joined one already) and takes its device
// (cuda:LOCAL_RANK with GPUs, else the CPU). The processes are started by weft-run (or
// torchrun-style variables, srun, mpirun); weft-train --nproc N starts them itself through
// weft-run (train/launch.h). Only rank 0 logs, writes metrics and checkpoints.
//
// Data parallelism alone (no pp): the model moves to the rank's device and is wrapped in
// DistributedDataParallel (after SyncBatchNorm::convert, with sync_batch_norm), with
// comm_hook's communication hook; the loaders become loaders over the same data with a
// DistributedSampler (training: a disjoint share of each epoch per rank, reshuffled by
// set_epoch) or a DistributedEvalSampler (evaluation: every test sample counted exactly once);
// the epoch's sums are all-reduced, so every rank reports the whole run's loss and accuracy.
//
// A pipeline (pp): every rank runs the same loop on the same model (built from the same
// seed), optimizer (over the whole model's parameters) and loaders: the loaders are not
// sharded over a pipeline's ranks (only over its replicas), each rank takes every batch and
// uses what its stages need (the first stage's rank the inputs, the last stage's the targets).
// prepare() wraps the model's Sequential (pipeline_sequential) in a
// parallel::pipeline::DistributedPipeline over the pipeline's ranks, which moves this rank's
// stages to its device; a step runs the schedule, and the optimizer updates the parameters
// that got gradients, which are this rank's stages' (the others' grads stay undefined, so
// step() skips them). The last stage's rank broadcasts each step's loss and each evaluated
// batch's outputs to its pipeline's ranks, so that they add up the same totals: reduce() does
// not sum them over a pipeline's ranks but checks that they agree, and takes the loss sum of
// the pipeline's first rank (the main process's is the one a resumed epoch starts from its
// checkpoint's partial sum).
//
// Note [Local SGD in the TrainLoop]: with local_sgd_period P, the first local_sgd_warmup
// steps are plain DDP's; after them each rank steps on its own gradients (the post-local SGD
// hook with no gradient all-reduce, parallel/ddp/post_localsgd_hook.h) and the replicas'
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
//
// Note [Replicated pipelines in the TrainLoop]: with dp_replicate = R > 1 beside pp, the job's
// ranks are R replicas of a pipeline of world / R ranks (Megatron's PP x DP, in parallel::pipeline::
// PipelineMesh's layout: rank r is position r / R of replica r % R). Each replica's ranks load
// their replica's shard of the data (DistributedSampler and DistributedEvalSampler over the R
// replicas, as ddp shards over its ranks: a batch is batch_size samples per replica) and run
// it through their pipeline, whose stages average their gradients over the ranks that hold the
// same stages in the other replicas, overlapped with the backward (Note [Replicated stages] in
// parallel/pipeline/distributed_pipeline.h), so every replica steps alike and the job trains as
// one model on batches of R x batch_size. The replicas' parameters and the optimizers' states
// stay bitwise equal (every rank of a replica group gets the same average); BatchNorm's running
// statistics do not (each replica sees its own samples), so consolidate_replicas first gives
// every replica replica 0's (broadcast_stages), as DDP broadcasts rank 0's before each forward.
// The epoch's sums are added over the replicas (each pipeline's ranks agreeing), the loss as the
// pipelines' first ranks hold it; checkpoints are replica 0's pipeline's, written by rank 0, and
// resume on any layout (another R, another pipeline length, one process, ddp). A mid-epoch one
// goes on in the same sample order on any R > 1 and in ddp; with R = 1 (or on one device) the
// epoch's order is the loader's own, so the rest of that epoch differs, and resume() says so.
//
// Note [Checkpoints of a pipeline across processes]: rank 0's copy of the model holds the
// weights it was built with outside its own stages. Before each checkpoint and each epoch's
// evaluation the loop calls consolidate_replicas: every stage's parameters and buffers are
// broadcast from its rank (DistributedPipeline::broadcast_stages), and the optimizer's state
// is put together from the ranks that step each parameter (parallel::gather_optimizer_state)
// and loaded into every rank's optimizer. The checkpoint then holds the whole model and
// optimizer under the model's own names, as a one-process run writes it: it resumes on another
// number of ranks, in one process, or in another mode, and back. The price: every rank holds
// the whole model (the layers of other ranks' stages where it built them: weft-train leaves
// them in host memory) and, from the first checkpoint, the whole optimizer state (beside each
// parameter). Random numbers: a checkpoint holds the main process's generators, which every
// rank restores, so a stage on another rank that draws random numbers (dropout) resumes on
// rank 0's stream, and such a run does not resume bitwise as it would have gone on (ConvNet
// and ResNet draw none).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/ddp/post_localsgd_hook.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/parallel_plan.h"
#include "parallel/optim/model_averaging.h"
#include "parallel/pipeline/distributed_pipeline.h"
#include "parallel/pipeline/pipeline_mesh.h"
#include "parallel/process_group/process_group.h"
#include "train/strategy.h"

namespace weft::train {

// How the model runs along pp: the DistributedPipeline's options that the strategy does not
// derive from the mesh.
struct PipelineAxisOptions {
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int virtual_stages = 1;        // stages per rank (the interleaved schedule)
  std::vector<size_t> balance;   // layers per stage; empty: as even as possible
  parallel::pipeline::Balancer balance_by;  // instead of balance: measured on rank 0, sent to the others
  std::string activation_checkpointing = "never";  // or except_last, always (pipeline.h)
};

struct DistributedStrategyOptions {
  std::optional<Device> device;  // default: cuda:LOCAL_RANK when there is a GPU, else cpu
  std::string backend;           // default: nccl for CUDA devices, gloo for the CPU
  // The ranks each parallelism takes. The default, {pp = kNone, dp_replicate = kRest}, is DDP
  // over every rank; {pp = kRest, dp_replicate = R} is R replicas of a pipeline over the rest
  // (Note [Replicated pipelines in the TrainLoop]).
  parallel::ParallelPlan plan;

  // Along dp_replicate without a pipeline: DDP and what it brings.
  parallel::DDPOptions ddp;
  // Every BatchNorm2d of the model becomes a parallel::SyncBatchNorm over the group before
  // DDP wraps it (PyTorch's convert_sync_batchnorm): the statistics of the whole job's batch.
  bool sync_batch_norm = false;
  // The DDP communication hook, by name (parallel::comm_hook_named): allreduce, fp16, bf16, powersgd.
  std::string comm_hook = "allreduce";
  // Local SGD (Note [Local SGD in the TrainLoop]): 0, plain DDP; P >= 1, the replicas averaged
  // every P steps after local_sgd_warmup steps of DDP. It brings its own communication hook
  // (comm_hook stays "allreduce"), and its optimizer must step each replica on its own: not
  // a ZeroRedundancyOptimizer, nor a PostLocalSGDOptimizer (which would average again).
  int64_t local_sgd_period = 0;
  int64_t local_sgd_warmup = 0;

  // Along pp.
  PipelineAxisOptions pipeline;
};

class DistributedStrategy final : public Strategy {
 public:
  explicit DistributedStrategy(DistributedStrategyOptions options = {});

  ParallelMode mode() const override;
  int world_size() const override { return group_->size(); }
  int rank() const override { return group_->rank(); }
  Device input_device() const override { return device_; }
  // This rank's share along the data-parallel dimension (the whole loader where it has one replica
  // of a pipeline).
  std::shared_ptr<data::DataLoader> shard(std::shared_ptr<data::DataLoader> loader, bool training) override;
  Tensor train_step(const data::Batch& batch, const Criterion& criterion, optim::Optimizer& optimizer) override;
  Tensor forward(const Tensor& input) override;
  Totals reduce(const Totals& local) override;
  void barrier() override;
  void consolidate_replicas(optim::Optimizer& optimizer) override;
  std::map<std::string, double> state_dict() const override;
  void check_state_dict(const std::map<std::string, double>& state) const override;
  void load_state_dict(const std::map<std::string, double>& state) override;
  std::vector<size_t> stage_layers() const override;

  const parallel::DeviceMesh& mesh() const { return *mesh_; }
  const parallel::ParallelPlan& plan() const { return plan_; }  // resolved against the world
  // Without pp: the DDP wrapper prepare() made.
  parallel::DistributedDataParallel& ddp() const;
  // Local SGD's steps so far (0 without it): the averager's count, which the hook's follows.
  int64_t local_sgd_step() const { return averager_ ? averager_->step() : 0; }
  // With pp: the pipeline prepare() made, and its groups.
  parallel::pipeline::DistributedPipeline& pipeline() const;
  const parallel::pipeline::PipelineMesh& pipeline_mesh() const { return pipeline_mesh_; }

 private:
  std::shared_ptr<nn::Module> prepare_model(std::shared_ptr<nn::Module> model) override;
  std::shared_ptr<nn::Module> prepare_replicas(std::shared_ptr<nn::Module> model);
  std::shared_ptr<nn::Module> prepare_pipeline(std::shared_ptr<nn::Module> model);
  Tensor pipeline_step(const data::Batch& batch, const Criterion& criterion, optim::Optimizer& optimizer);
  Totals reduce_over_pipelines(const Totals& local);
  void average_local_sgd_replicas(optim::Optimizer& optimizer);
  void gather_stages(optim::Optimizer& optimizer);
  // Throws when `optimizer` cannot train local SGD's replicas (see the options).
  void check_local_sgd_optimizer(const optim::Optimizer& optimizer) const;
  // `t` (defined on the last stage's rank) on every rank of its pipeline; `t`'s dtype and shape
  // travel first.
  Tensor broadcast_from_last_stage(const Tensor& t) const;
  // The rank of the pipeline whose stage holds `param` (an optimizer's), or -1.
  int owner_of(const Tensor& param) const;

  DistributedStrategyOptions options_;
  parallel::ParallelPlan plan_;
  Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;  // the whole job
  std::unique_ptr<parallel::DeviceMesh> mesh_;
  // Without pp: DDP over dp_replicate, and local SGD (null without it): the hook's state, the
  // averager, and the parameters it averages.
  std::shared_ptr<parallel::DistributedDataParallel> ddp_;
  std::shared_ptr<parallel::PostLocalSGDState> local_sgd_;
  std::unique_ptr<parallel::PeriodicModelAverager> averager_;
  std::vector<Tensor> params_;
  // With pp.
  parallel::pipeline::PipelineMesh pipeline_mesh_;
  std::shared_ptr<parallel::pipeline::DistributedPipeline> pipeline_;
  std::map<const void*, int> owners_;  // each stage's parameters (by identity) -> its pipeline rank
};

}  // namespace weft::train
