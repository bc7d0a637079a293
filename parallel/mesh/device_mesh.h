// DeviceMesh: the ranks of the default group laid out as an n-dimensional grid with named
// dimensions, one process group per dimension (PyTorch's init_device_mesh, torchtitan's
// ParallelDims). Each parallelism is applied along one dimension: a pipeline's stages send to
// the next rank along "pp", data-parallel replicas average along "dp_replicate", sharded
// data parallelism gathers along "dp_shard", tensor parallelism along "tp".
//
//   init_process_group("gloo");                                   // 8 ranks
//   DeviceMesh mesh({{"pp", 2}, {"dp_replicate", 2}, {"tp", 2}});
//   mesh.coordinate("pp");         // this rank's stage
//   mesh.group("dp_replicate");    // the 2 ranks that hold the same stage and tensor shard
//
// Rank order: row-major, the first dimension outermost and the last varying fastest, so rank
// r's coordinates are the digits of r in the mixed radix of the sizes (PyTorch's
// arange(world).view(sizes)). List the dimension with the most traffic last: consecutive
// ranks share a machine (weft-run numbers a machine's ranks consecutively), and Megatron and
// torchtitan put tensor parallelism innermost, then data parallelism, then the pipeline, whose
// small point-to-point messages cross machines best.
//
// group(name) is this rank's group along one dimension: the ranks whose other coordinates equal
// this rank's, renumbered by their coordinate along it (a rank's rank in group(d) is
// coordinate(d)). A dimension that spans the whole world is the default group itself; every
// other dimension's groups are made by the constructor, all of them, on every rank, in the order
// of the dimensions (new_group's rule: every rank makes every group in the same order).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/process_group/process_group.h"

namespace weft::parallel {

struct MeshDimension {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  // A mesh over the default group (a collective: every rank constructs it, with the same
  // dimensions). The sizes' product must be the world size, the names distinct and non-empty;
  // errors name the dimensions and the world.
  explicit DeviceMesh(std::vector<MeshDimension> dimensions);

  int ndim() const { return static_cast<int>(dims_.size()); }
  const std::vector<MeshDimension>& dimensions() const { return dims_; }
  bool has(const std::string& name) const { return index_of(name) >= 0; }
  int size(const std::string& name) const;
  int world_size() const { return world_; }
  int rank() const { return rank_; }  // in the default group

  // This rank's place along one dimension, and along all of them (in the mesh's order).
  int coordinate(const std::string& name) const;
  const std::vector<int>& coordinates() const { return coords_; }
  // The rank at `coordinates` (one per dimension), and the coordinates of `rank`.
  int rank_at(const std::vector<int>& coordinates) const;
  std::vector<int> coordinates_of(int rank) const;

  // This rank's group along `name` (an error naming the mesh's dimensions when it has none).
  const std::shared_ptr<ProcessGroup>& group(const std::string& name) const;
  // The ranks of the default group in this rank's group along `name`, in group-rank order.
  std::vector<int> group_ranks(const std::string& name) const;

  // "pp=2 x dp_replicate=4 (rank 5 at pp=1, dp_replicate=1)".
  std::string str() const;

 private:
  int index_of(const std::string& name) const;
  std::string str_of_sizes() const;  // "pp=2 x dp_replicate=4"
  int checked_index(const std::string& name) const;

  std::vector<MeshDimension> dims_;
  std::vector<int> coords_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // one per dimension
  int world_ = 1, rank_ = 0;
};

// The ranks of each group along dimension `dim` of a mesh of `sizes`, groups in the order of
// their lowest rank and each group's ranks by coordinate along `dim`: what the constructor makes,
// as a pure function that tests can check against a table.
std::vector<std::vector<int>> mesh_groups_along(const std::vector<int>& sizes, size_t dim);

}  // namespace weft::parallel
