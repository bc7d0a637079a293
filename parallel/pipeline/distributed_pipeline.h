// DistributedPipeline: a pipeline whose stages live in different processes, one rank of a
// process group each (torch.distributed.pipelining's PipelineStage + schedule, started with
// weft-run or torchrun).
//
//   init_process_group("gloo");                          // or "nccl" with CUDA devices
//   auto model = make_model();                           // every rank builds the whole model (same seed)
//   parallel::pipeline::DistributedPipeline pipe(model, parallel::default_group_ptr(),
//       {.device = kCPU, .micro_batches = 4, .schedule = "1f1b"});
//   optim::SGD sgd(pipe.parameters(), {0.01});           // this rank's stages only
//   auto result = pipe.step(images, labels, criterion);  // images used on the first stage's rank,
//   sgd.step();                                          // labels on the last stage's
//
// Every rank must build the same model with the same options (checked at construction: an
// error names the first field and the ranks that differ). Stage s lives on rank s % R of the
// group's R ranks (one stage per rank, or virtual_stages per rank with the interleaved
// schedule), split from the Sequential as Pipeline splits it (balance; or balance_by, which
// rank 0 alone measures and sends to the others, since measured times differ between
// processes; or even by layer count). Each rank keeps its stages' layers, moved to its device,
// as its children under the Sequential's names (its state_dict holds its own layers), and
// runs its list of the schedule's actions; activations and gradients travel with the group's
// send and recv (each preceded by a small header with the dtype and shape, so the receiver
// needs no shape inference). Between two ranks messages are matched in the order sent, so a
// schedule is refused where the order in which a rank sends to another differs from the
// order the other receives in (the built-in ones are in order). Every pair of ranks that a
// schedule connects exchanges one message each way when the schedule is set (at construction
// and in set_schedule, which every rank calls alike), so that NCCL makes its communicators
// before any step (Note [Connecting before the first step]).
//
// step() returns, on the last stage's rank, the batch's mean loss and the outputs (as
// Pipeline::step); on the other ranks both are undefined. A batch of fewer samples than
// micro_batches (an epoch's short last batch) runs one sample per micro-batch under the same
// built-in schedule (interleaved: a multiple of the ranks), as in Pipeline. For that every rank
// must know the batch's size, so each rank must then pass the input or the target (the
// TrainLoop's strategy passes both to every rank): a rank that passes neither runs the whole
// schedule and waits for messages that do not come, until the group's timeout. Gradients are
// those of the whole batch's mean loss, as in one process. forward() is inference
// (torch.distributed.pipelining's step without a target): the whole batch through the stages
// in turn, without gradients; the output on the last stage's rank, undefined on the others.
//
// Each rank trains its stages only; the rest of its copy of the model keeps the values it was
// built with. broadcast_stages() makes every rank's copy the whole trained model, for a rank
// that saves or evaluates it alone (the TrainLoop's checkpoints: train/distributed_strategy.h).
//
// Note [Replicated stages]: pipelines replicated over data-parallel groups (Megatron's PP x DP,
// pipeline_mesh.h) are built from a PipelineMesh, or with replicas_group: the ranks that hold this
// rank's stages in the other replicas. Each replica steps on its share of the batch, and step()
// averages its stages' gradients over their replicas, overlapped with the backward as DDP overlaps
// it and as Megatron's overlap_grad_reduce does in a pipeline: each stage has a parallel::Reducer
// over its trainable parameters (buckets of bucket_cap_mb, the first of first_bucket_mb, in the
// order gradients arrive), which lets the gradients of the stage's micro-batches accumulate (DDP's
// no_sync) until the backward of its last micro-batch, where each bucket's all-reduce is launched
// as soon as its gradients are in (torch.distributed.pipelining arms DDP's reducer so for the last
// backward). The rank then goes on, sending that backward's gradient to the previous stage, and
// waits for the buckets only when its schedule is done, so the all-reduce of the last stages runs
// during the other stages' cool-down, the first stage's only during its own last backward
// (interleaved, a rank's later stage's also during its earlier stage's remaining backwards). The
// replicas' parameters and optimizer states stay bitwise equal (every member of a group gets the
// same average); their buffers do not (BatchNorm's statistics follow each replica's samples), and
// broadcast_stages() first gives every replica replica 0's. At construction the replicas of each
// stage are compared (the names, shapes and dtypes of their tensors; a difference fails every rank
// of the job, the ranks concerned naming it), then take replica 0's values, as DDP's construction
// takes rank 0's. Every trainable parameter of a stage must get a gradient in the backward of the
// stage's last micro-batch, or its replicas would wait for its bucket (an error names it); with
// find_unused_parameters, as in DDP, those that took no part in that micro-batch's forward are
// found after it and contribute what the stage's other micro-batches gave them (DDP's no_sync
// gradients), at the cost of a walk of that forward's graph and a small all-reduce per stage and
// step. The trainable parameters are those at construction (a step after another is frozen or
// unfrozen is an error). Every replica must give step() batches of the same size (the same
// schedule).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/sequential.h"
#include "parallel/ddp/reducer.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/pipeline/pipeline_mesh.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_runner.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel::pipeline {

struct DistributedPipelineOptions {
  Device device = kCPU;             // this rank's (a CUDA device with the nccl backend)
  std::vector<size_t> balance;      // layers per stage; empty: as even as possible
  Balancer balance_by;              // instead of balance: measured on rank 0 (balance.h)
  // The ranks of this pipeline and of its replicas, which build their pipelines together (null:
  // this pipeline's own group). Every rank of it must give the same model and options (checked
  // at construction across it), and with balance_by its rank 0 measures for all of them, so
  // that every replica splits alike. Replicated pipelines (PipelineMesh) pass the whole job's.
  std::shared_ptr<ProcessGroup> job_group;
  // Replicas of this pipeline (Note [Replicated stages]): the ranks that hold this rank's stages
  // in every replica (PipelineMesh::replicas_group), over which step() averages their gradients;
  // needs job_group. Null: no replicas.
  std::shared_ptr<ProcessGroup> replicas_group;
  double bucket_cap_mb = 25;   // replicas: the reducers' buckets (DDP's bucket_cap_mb, first_bucket_mb)
  double first_bucket_mb = 1;
  // Replicas: as DDP's; parameters that take no part in a stage's last micro-batch are found
  // after its forward and contribute the gradients their stage's other micro-batches gave them.
  bool find_unused_parameters = false;
  int micro_batches = 1;
  std::string schedule = "1f1b";    // gpipe, 1f1b or interleaved
  int virtual_stages = 1;           // stages per rank (interleaved)
  std::string activation_checkpointing = "never";  // or except_last, always (as Pipeline's)
};

// Throws naming the first two ranks whose messages would be matched out of order.
void check_messages_in_order(const Schedule& schedule);

class DistributedPipeline : public nn::Module {
 public:
  DistributedPipeline(std::shared_ptr<nn::Sequential> model, std::shared_ptr<ProcessGroup> group,
                      DistributedPipelineOptions options);
  // This rank's replica of a pipeline of `mesh` (pipeline_mesh): over mesh.pipeline, with
  // job_group and replicas_group the mesh's (Note [Replicated stages]).
  DistributedPipeline(std::shared_ptr<nn::Sequential> model, const PipelineMesh& mesh,
                      DistributedPipelineOptions options);

  StepResult step(const Tensor& input, const Tensor& target, const Criterion& criterion);
  // Every rank calls it; `input` is used on the first stage's rank (others may pass anything).
  Tensor forward(const Tensor& input) override;
  // A collective: each stage's parameters and buffers, broadcast from the rank that holds it
  // into every other rank's copy (one broadcast per stage and dtype, through this rank's device).
  // With replicas, every rank of the job gets replica 0's (its buffers first go to the others).
  void broadcast_stages();

  void set_schedule(Schedule schedule);
  const Schedule& schedule() const { return schedule_; }
  int num_stages() const { return schedule_.num_stages; }
  bool holds_stage(int s) const { return schedule_.rank_of(s) == group_->rank(); }
  // Stage s: its layers, shared with the model given (held by rank schedule().rank_of(s)).
  const nn::Sequential& stage(int s) const { return *stages_.at(static_cast<size_t>(s)); }
  std::vector<size_t> balance() const { return layer_counts(stages_); }  // layers per stage
  std::string extra_repr() const override;

 protected:
  std::shared_ptr<nn::Module> shallow_copy() const override;

 private:
  // All-gathers the model's layer count and the options over job_group (else the pipeline's
  // group); a rank that differs is an error naming the field and both ranks (on every rank),
  // instead of a wait for messages that never come.
  void check_ranks_agree(size_t layers) const;
  // balance_by's result on rank 0 of job_group (else of the pipeline's group), on every rank of
  // that group (a collective). When it fails on that rank 0, every rank fails.
  std::vector<size_t> measured_balance(const nn::Sequential& model, int stages) const;
  // The ranks that build their pipelines together: job_group, else the pipeline's group.
  ProcessGroup& job() const { return options_.job_group ? *options_.job_group : *group_; }
  // "rank r", or with replicas "pipeline rank r (rank g of the job)": for errors, which the
  // launcher's rank numbers should match.
  std::string rank_name() const;
  // The schedule of a step on this batch: schedule_, or for a batch of fewer samples than
  // micro_batches the built-in schedule of micro_batches_for_batch's count (made once per
  // count). The size is the input's where this rank has it, else the target's.
  const Schedule& schedule_for(const Tensor& input, const Tensor& target);
  // parallel::connect_peers for the pairs of ranks the schedule sends between.
  void connect_peers(const Schedule& schedule) const;
  // With replicas: throws on every rank when the replicas of some position hold different
  // stages (naming the first difference where it is), then gives them replica 0's tensors.
  void start_replicas_equal() const;
  // With replicas: a reducer over each held stage's trainable parameters (Note [Replicated stages]).
  void make_reducers();
  // A step that failed after a reducer began leaves the replicas out of step, and a stage
  // whose trainable parameters changed since construction would not average them: both are errors.
  void check_reducers_ready() const;
  // Every reducer's finish(), in stage order; the first error is rethrown after all ran.
  void finish_reducers();

  std::shared_ptr<ProcessGroup> group_;
  DistributedPipelineOptions options_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;  // every stage; only this rank's are used
  Schedule schedule_;
  std::map<int, Schedule> short_schedules_;  // by micro-batches: schedule_for's
  std::map<int, std::unique_ptr<Reducer>> reducers_;  // by stage: this rank's with trainable parameters
};

}  // namespace weft::parallel::pipeline
