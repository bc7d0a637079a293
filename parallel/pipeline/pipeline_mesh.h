// PipelineMesh: the default group's ranks as a grid of pipelines and their replicas (Megatron's
// PP x DP): the groups a DistributedPipeline needs, read off a DeviceMesh with dimensions
// ("pp", "dp_replicate") (parallel/mesh/device_mesh.h).
//
//   init_process_group("gloo");                    // weft-run --nproc-per-node 4
//   auto mesh = parallel::pipeline::pipeline_mesh(/*replicas=*/2);
//   DistributedPipeline pipe(model, mesh, {...});  // this rank's replica of the pipeline
//   ... pipe.step(my share of the batch);           // gradients averaged over the replicas
//
// R replicas of a pipeline of P ranks need R * P ranks. Rank r is position r / R of replica
// r % R: the R replicas of a position are consecutive ranks (ranks 0 .. R-1 hold every
// replica's first stages), and a pipeline's ranks are R apart (replica 0: ranks 0, R, 2R, ...).
// This is Megatron's order: the data-parallel groups stay inside a machine, where the gradients'
// all-reduce has the fastest links, and the pipeline's smaller point-to-point messages cross
// machines. Rank 0 is replica 0's first stage.
#pragma once

#include <memory>

#include "parallel/mesh/device_mesh.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel::pipeline {

struct PipelineMesh {
  int replicas = 1;  // R
  int replica = 0;   // this rank's replica: rank % R
  int position = 0;  // this rank's place in its pipeline: rank / R (its rank in `pipeline`)
  // This rank's pipeline: ranks replica, replica + R, ... (the default group when R is 1).
  std::shared_ptr<ProcessGroup> pipeline;
  // The ranks that hold the same stages as this rank, in every replica: ranks position * R ..
  // position * R + R - 1, renumbered by replica. Null when R is 1 (nothing to average): a
  // program that averages checks for it.
  std::shared_ptr<ProcessGroup> replicas_group;
  // The whole job: the default group.
  std::shared_ptr<ProcessGroup> job;
};

// The mesh over the default group (a collective: every rank calls it, with the same R): the
// DeviceMesh pp=world/R x dp_replicate=R (pp alone when R is 1). A world size that R does not
// divide is an error naming both.
PipelineMesh pipeline_mesh(int replicas);
// The pipelines and replicas of a mesh with a "pp" dimension and, optionally, "dp_replicate"
// (others, such as a future "tp", are not part of a pipeline's groups). A collective: where
// the replicas span the whole job it makes their group, which is not the default group.
PipelineMesh pipeline_mesh(const DeviceMesh& mesh);

}  // namespace weft::parallel::pipeline
