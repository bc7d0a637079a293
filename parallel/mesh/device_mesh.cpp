// The grid of ranks and its groups; see device_mesh.h.
#include "parallel/mesh/device_mesh.h"

#include <cstdint>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "parallel/process_group/distributed.h"

namespace weft::parallel {

namespace {

// Ranks between neighbours along each dimension: the product of the sizes after it.
std::vector<int> strides_of(const std::vector<int>& sizes) {
  std::vector<int> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  return strides;
}

std::string names_of(const std::vector<MeshDimension>& dims) {
  std::string out;
  for (const MeshDimension& d : dims) out += (out.empty() ? "" : ", ") + d.name;
  return out.empty() ? "none" : out;
}

}  // namespace

std::vector<std::vector<int>> mesh_groups_along(const std::vector<int>& sizes, size_t dim) {
  WEFT_CHECK(dim < sizes.size(), "mesh_groups_along: dimension ", dim, " of a ", sizes.size(), "-dimensional mesh");
  int64_t world = 1;
  for (int s : sizes) {
    WEFT_CHECK(s >= 1, "mesh_groups_along: a dimension of size ", s);
    world *= s;
    WEFT_CHECK(world <= std::numeric_limits<int>::max(), "mesh_groups_along: the sizes make more ranks than an int "
               "counts");
  }
  const std::vector<int> strides = strides_of(sizes);
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < static_cast<int>(world); ++r) {
    if ((r / strides[dim]) % sizes[dim] != 0) continue;  // each group starts at its coordinate 0
    std::vector<int> ranks;
    for (int k = 0; k < sizes[dim]; ++k) ranks.push_back(r + k * strides[dim]);
    groups.push_back(std::move(ranks));
  }
  return groups;
}

DeviceMesh::DeviceMesh(std::vector<MeshDimension> dimensions) : dims_(std::move(dimensions)) {
  WEFT_CHECK(!dims_.empty(), "DeviceMesh: needs at least one dimension");
  world_ = get_world_size();
  rank_ = get_rank();
  std::vector<int> sizes;
  int64_t product = 1;
  bool exact = true;  // product is the sizes' whole product
  for (size_t d = 0; d < dims_.size(); ++d) {
    const MeshDimension& dim = dims_[d];
    WEFT_CHECK(!dim.name.empty(), "DeviceMesh: dimension ", d, " has no name");
    WEFT_CHECK(dim.size >= 1, "DeviceMesh: dimension '", dim.name, "' has size ", dim.size, "; sizes are >= 1");
    for (size_t e = 0; e < d; ++e)
      WEFT_CHECK(dims_[e].name != dim.name, "DeviceMesh: dimension '", dim.name, "' is named twice");
    sizes.push_back(dim.size);
    // Multiplied while product <= world (two ints: no overflow); past the world it is wrong anyway.
    if (product <= world_) product *= dim.size;
    else exact = false;
  }
  WEFT_CHECK(product == world_, "DeviceMesh: the sizes of ", str_of_sizes(), " make ",
             exact ? std::to_string(product) : "more than " + std::to_string(product), " ranks, but the job "
             "has ", world_, world_ == 1 ? " rank" : " ranks", " (the product of the sizes must be the world size)");
  coords_ = coordinates_of(rank_);
  groups_.resize(dims_.size());
  for (size_t d = 0; d < dims_.size(); ++d) {
    if (dims_[d].size == world_) {
      groups_[d] = default_group_ptr();
      continue;
    }
    for (const std::vector<int>& ranks : mesh_groups_along(sizes, d))
      if (auto group = new_group(ranks)) groups_[d] = std::move(group);
  }
}

std::string DeviceMesh::str_of_sizes() const {
  std::string out;
  for (const MeshDimension& d : dims_) out += (out.empty() ? "" : " x ") + d.name + "=" + std::to_string(d.size);
  return out;
}

int DeviceMesh::index_of(const std::string& name) const {
  for (size_t d = 0; d < dims_.size(); ++d)
    if (dims_[d].name == name) return static_cast<int>(d);
  return -1;
}

int DeviceMesh::checked_index(const std::string& name) const {
  const int d = index_of(name);
  WEFT_CHECK(d >= 0, "DeviceMesh: no dimension named '", name, "' (this mesh has ", names_of(dims_), ")");
  return d;
}

int DeviceMesh::size(const std::string& name) const { return dims_[checked_index(name)].size; }

int DeviceMesh::coordinate(const std::string& name) const { return coords_[checked_index(name)]; }

int DeviceMesh::rank_at(const std::vector<int>& coordinates) const {
  WEFT_CHECK(coordinates.size() == dims_.size(), "DeviceMesh::rank_at: ", coordinates.size(), " coordinates for ",
             dims_.size(), " dimensions (", names_of(dims_), ")");
  int rank = 0;
  for (size_t d = 0; d < dims_.size(); ++d) {
    WEFT_CHECK(coordinates[d] >= 0 && coordinates[d] < dims_[d].size, "DeviceMesh::rank_at: coordinate ",
               coordinates[d], " along '", dims_[d].name, "' is not in [0, ", dims_[d].size, ")");
    rank = rank * dims_[d].size + coordinates[d];
  }
  return rank;
}

std::vector<int> DeviceMesh::coordinates_of(int rank) const {
  WEFT_CHECK(rank >= 0 && rank < world_, "DeviceMesh: rank ", rank, " is not in [0, ", world_, ")");
  std::vector<int> coords(dims_.size());
  for (size_t d = dims_.size(); d-- > 0;) {
    coords[d] = rank % dims_[d].size;
    rank /= dims_[d].size;
  }
  return coords;
}

const std::shared_ptr<ProcessGroup>& DeviceMesh::group(const std::string& name) const {
  return groups_[checked_index(name)];
}

std::vector<int> DeviceMesh::group_ranks(const std::string& name) const {
  const size_t d = static_cast<size_t>(checked_index(name));
  std::vector<int> coords = coords_, ranks;
  for (int k = 0; k < dims_[d].size; ++k) {
    coords[d] = k;
    ranks.push_back(rank_at(coords));
  }
  return ranks;
}

std::string DeviceMesh::str() const {
  std::ostringstream out;
  out << str_of_sizes() << " (rank " << rank_ << " at ";
  for (size_t d = 0; d < dims_.size(); ++d) out << (d ? ", " : "") << dims_[d].name << "=" << coords_[d];
  out << ")";
  return out.str();
}

}  // namespace weft::parallel
