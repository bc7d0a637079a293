// The pipelines and replica groups of a PipelineMesh; see pipeline_mesh.h.
#include "parallel/pipeline/pipeline_mesh.h"

#include <vector>

#include "core/error.h"
#include "parallel/distributed.h"

namespace weft::parallel::pipeline {

PipelineMesh pipeline_mesh(int replicas) {
  const int world = get_world_size(), rank = get_rank();
  WEFT_CHECK(replicas >= 1 && world % replicas == 0, "pipeline_mesh: ", replicas, " replicas of a pipeline need a "
             "world size that ", replicas, " divides (replicas x ranks per pipeline), but the job has ", world,
             world == 1 ? " rank" : " ranks");
  PipelineMesh mesh;
  mesh.replicas = replicas;
  mesh.replica = rank % replicas;
  mesh.position = rank / replicas;
  mesh.job = default_group_ptr();
  if (replicas == 1) {
    mesh.pipeline = default_group_ptr();
    return mesh;
  }
  // Every rank makes every group, in the same order (new_group is a collective of the default group).
  const int positions = world / replicas;
  for (int d = 0; d < replicas; ++d) {
    std::vector<int> ranks;
    for (int p = 0; p < positions; ++p) ranks.push_back(p * replicas + d);
    if (auto group = new_group(ranks)) mesh.pipeline = std::move(group);
  }
  for (int p = 0; p < positions; ++p) {
    std::vector<int> ranks;
    for (int d = 0; d < replicas; ++d) ranks.push_back(p * replicas + d);
    if (auto group = new_group(ranks)) mesh.replicas_group = std::move(group);
  }
  return mesh;
}

}  // namespace weft::parallel::pipeline
