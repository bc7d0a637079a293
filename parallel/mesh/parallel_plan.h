// ParallelPlan: how many ranks each parallelism takes, and the DeviceMesh that lays them out
// (torchtitan's ParallelDims). A program, or the TrainLoop's DistributedStrategy, states the
// sizes; the plan checks them against the world, fills in the one left open, and builds one
// mesh whose dimensions each parallelism is then applied along, in turn. A new parallelism is
// a new field here and a new step where the model is prepared, not a new class per
// combination.
//
//   ParallelPlan{.pp = 2, .dp_replicate = ParallelPlan::kRest}.resolved(8)  // pp=2 x dp_replicate=4
//
// Dimensions, outermost first (Megatron's and torchtitan's order, device_mesh.h says why):
//   pp            ranks per pipeline: each holds some stages of the model; kNone (0) where the
//                 model is not split (a plan with pp = 1 is a pipeline of one stage, which an
//                 elastic job that shrank to one rank runs).
//   dp_replicate  data-parallel replicas: each holds the whole model (or its pipeline position)
//                 and its share of the data; their gradients are averaged.
// Sharded data parallelism (dp_shard) and tensor parallelism (tp) take their places after
// dp_replicate, tp innermost.
#pragma once

#include <string>
#include <vector>

#include "parallel/mesh/device_mesh.h"

namespace weft::parallel {

struct ParallelPlan {
  static constexpr int kNone = 0;   // this parallelism is not used
  static constexpr int kRest = -1;  // the ranks the other dimensions leave (at most one field)

  int pp = kNone;
  int dp_replicate = kRest;

  // The plan for `world` ranks, kRest filled in. Errors name the plan and the world: sizes
  // below kRest, more than one kRest, or sizes whose product is not the world.
  ParallelPlan resolved(int world) const;
  bool pipelined() const { return pp != kNone; }
  // The mesh's dimensions of a resolved plan: pp when pipelined (even of size 1), dp_replicate
  // when above 1 or when it is the only dimension.
  std::vector<MeshDimension> dimensions() const;
  // "pp=2 x dp_replicate=4", with "rest" for kRest and pp left out when kNone.
  std::string str() const;
};

// The mesh of `plan` over the default group (resolved against its world size; a collective:
// every rank calls it with the same plan).
DeviceMesh build_mesh(const ParallelPlan& plan);

}  // namespace weft::parallel
