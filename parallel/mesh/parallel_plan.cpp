// A plan's sizes checked and laid out; see parallel_plan.h.
#include "parallel/mesh/parallel_plan.h"

#include <cstdint>

#include "core/error.h"
#include "parallel/process_group/distributed.h"

namespace weft::parallel {

namespace {

std::string size_text(int size) { return size == ParallelPlan::kRest ? "rest" : std::to_string(size); }

}  // namespace

std::string ParallelPlan::str() const {
  std::string out = pp == kNone ? "" : "pp=" + size_text(pp) + " x ";
  return out + "dp_replicate=" + size_text(dp_replicate);
}

ParallelPlan ParallelPlan::resolved(int world) const {
  WEFT_CHECK(world >= 1, "ParallelPlan: a world of ", world, " ranks");
  WEFT_CHECK(pp >= kRest && dp_replicate >= kRest, "ParallelPlan ", str(), ": sizes are >= 1, or kNone (0) for pp, ",
             "or kRest (-1)");
  WEFT_CHECK(dp_replicate != kNone, "ParallelPlan ", str(), ": dp_replicate is at least 1 (one replica)");
  WEFT_CHECK(!(pp == kRest && dp_replicate == kRest), "ParallelPlan ", str(), ": at most one size is the rest");
  ParallelPlan plan = *this;
  // Two ints: the product fits 64 bits.
  const int64_t fixed = int64_t{pp > 0 ? pp : 1} * int64_t{dp_replicate > 0 ? dp_replicate : 1};
  const bool open = pp == kRest || dp_replicate == kRest;
  WEFT_CHECK(open ? world % fixed == 0 : world == fixed, "ParallelPlan ", str(), " does not fit the job's ", world,
             world == 1 ? " rank" : " ranks", open ? ": the fixed sizes must divide it" : ": the sizes multiply to " +
             std::to_string(fixed));
  if (plan.pp == kRest) plan.pp = static_cast<int>(world / fixed);
  if (plan.dp_replicate == kRest) plan.dp_replicate = static_cast<int>(world / fixed);
  return plan;
}

std::vector<MeshDimension> ParallelPlan::dimensions() const {
  WEFT_CHECK(pp != kRest && dp_replicate != kRest, "ParallelPlan ", str(), ": resolve the plan against a world first");
  std::vector<MeshDimension> dims;
  if (pipelined()) dims.push_back({"pp", pp});
  if (dp_replicate > 1 || dims.empty()) dims.push_back({"dp_replicate", dp_replicate});
  return dims;
}

DeviceMesh build_mesh(const ParallelPlan& plan) { return DeviceMesh(plan.resolved(get_world_size()).dimensions()); }

}  // namespace weft::parallel
