// DistributedPipelineStrategy: the TrainLoop's 'pipeline' mode across processes, a stage per
// rank (weft-train --mode pipeline --nproc N, or started by weft-run, torchrun, srun, mpirun).
//
// Every rank runs the same loop on the same model (built from the same seed), optimizer
// (over the whole model's parameters) and loaders: the loaders are not sharded over a
// pipeline's ranks (only over its replicas, below), each rank takes every batch and uses what
// its stages need (the first stage's rank the inputs, the last stage's the targets). prepare()
// wraps the model's Sequential (pipeline_sequential) in a
// parallel::pipeline::DistributedPipeline over the pipeline's ranks, which moves this rank's
// stages to its device; a step runs the schedule, and the optimizer updates the parameters
// that got gradients, which are this rank's stages' (the others' grads stay undefined, so
// step() skips them). The last stage's rank broadcasts each step's loss and each evaluated
// batch's outputs to its pipeline's ranks, so that they add up the same totals: reduce() does
// not sum them over a pipeline's ranks but checks that they agree, and takes the loss sum of
// the pipeline's first rank (the main process's is the one a resumed epoch starts from its
// checkpoint's partial sum). Only rank 0 logs, writes metrics and checkpoints.
//
// Note [Replicated pipelines in the TrainLoop]: with replicas = R > 1 the job's ranks are R
// replicas of a pipeline of world / R ranks (Megatron's PP x DP, in parallel::pipeline::
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

#include "parallel/pipeline/distributed_pipeline.h"
#include "parallel/pipeline/pipeline_mesh.h"
#include "parallel/process_group.h"
#include "train/strategy.h"

namespace weft::train {

struct DistributedPipelineStrategyOptions {
  std::optional<Device> device;  // default: cuda:LOCAL_RANK when there is a GPU, else cpu
  std::string backend;           // default: nccl for CUDA devices, gloo for the CPU
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int virtual_stages = 1;        // stages per rank (the interleaved schedule)
  std::vector<size_t> balance;   // layers per stage; empty: as even as possible
  parallel::pipeline::Balancer balance_by;  // instead of balance: measured on rank 0, sent to the others
  std::string activation_checkpointing = "never";  // or except_last, always (pipeline.h)
  // Replicas of the pipeline, each with its share of the data (Note [Replicated pipelines in the
  // TrainLoop]); the job's world size must be a multiple. 1: one pipeline over every rank.
  int replicas = 1;
};

class DistributedPipelineStrategy final : public Strategy {
 public:
  explicit DistributedPipelineStrategy(DistributedPipelineStrategyOptions options = {});

  ParallelMode mode() const override { return ParallelMode::Pipeline; }
  int world_size() const override { return group_->size(); }
  int rank() const override { return group_->rank(); }
  std::shared_ptr<nn::Module> prepare(std::shared_ptr<nn::Module> model) override;
  Device input_device() const override { return device_; }
  // replicas > 1: this replica's shard (Note [Replicated pipelines in the TrainLoop]).
  std::shared_ptr<data::DataLoader> shard(std::shared_ptr<data::DataLoader> loader, bool training) override;
  Tensor train_step(nn::Module& model, const data::Batch& batch, const Criterion& criterion,
                    optim::Optimizer& optimizer) override;
  Tensor forward(nn::Module& model, const Tensor& input) override;
  Totals reduce(const Totals& local) override;
  void barrier() override;
  void consolidate_replicas(optim::Optimizer& optimizer) override;

  parallel::pipeline::DistributedPipeline& pipeline() const;
  const parallel::pipeline::PipelineMesh& mesh() const { return mesh_; }

 private:
  // `t` (defined on the last stage's rank) on every rank of its pipeline; `t`'s dtype and shape
  // travel first.
  Tensor broadcast_from_last_stage(const Tensor& t) const;
  // The rank of the pipeline whose stage holds `param` (an optimizer's), or -1.
  int owner_of(const Tensor& param) const;

  DistributedPipelineStrategyOptions options_;
  Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;  // the whole job
  parallel::pipeline::PipelineMesh mesh_;
  std::shared_ptr<parallel::pipeline::DistributedPipeline> pipeline_;
  std::map<const void*, int> owners_;  // each stage's parameters (by identity) -> its pipeline rank
};

}  // namespace weft::train
