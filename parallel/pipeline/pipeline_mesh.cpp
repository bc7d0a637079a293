// The pipelines and replica groups of a PipelineMesh; see pipeline_mesh.h.
#include "parallel/pipeline/pipeline_mesh.h"

#include "core/error.h"
#include "parallel/process_group/distributed.h"

namespace weft::parallel::pipeline {

PipelineMesh pipeline_mesh(int replicas) {
  const int world = get_world_size();
  WEFT_CHECK(replicas >= 1 && world % replicas == 0, "pipeline_mesh: ", replicas, " replicas of a pipeline need a "
             "world size that ", replicas, " divides (replicas x ranks per pipeline), but the job has ", world,
             world == 1 ? " rank" : " ranks");
  if (replicas == 1) return pipeline_mesh(DeviceMesh({{"pp", world}}));
  return pipeline_mesh(DeviceMesh({{"pp", world / replicas}, {"dp_replicate", replicas}}));
}

PipelineMesh pipeline_mesh(const DeviceMesh& mesh) {
  WEFT_CHECK(mesh.has("pp"), "pipeline_mesh: the mesh ", mesh.str(), " has no 'pp' dimension");
  PipelineMesh out;
  out.pipeline = mesh.group("pp");
  out.position = mesh.coordinate("pp");
  out.job = default_group_ptr();
  if (mesh.has("dp_replicate") && mesh.size("dp_replicate") > 1) {
    out.replicas = mesh.size("dp_replicate");
    out.replica = mesh.coordinate("dp_replicate");
    out.replicas_group = mesh.group("dp_replicate");
    // Replicas of one-rank pipelines span the job. Their gradients' averages get a group of
    // their own rather than the default group (the mesh's answer for such a dimension), so that
    // on NCCL they run on their own communicator and stream, beside the job's collectives.
    if (out.replicas_group == default_group_ptr())
      out.replicas_group = new_group(mesh.group_ranks("dp_replicate"));
  }
  return out;
}

}  // namespace weft::parallel::pipeline
