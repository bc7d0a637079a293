// DeviceMesh and ParallelPlan: the rank order as a table (mesh_groups_along, a pure function),
// the plan's sizes and errors, and real meshes over 2 and 4 Gloo ranks (process_group_worker's
// "mesh" scenario: coordinates, group sizes and ranks, an all-reduce along every dimension).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/error.h"
#include "gloo_suite.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/parallel_plan.h"
#include "spawn_ranks.h"
#include "test_util.h"

using namespace weft;
using namespace weft::parallel;
using Groups = std::vector<std::vector<int>>;

TEST_CASE("mesh_groups_along: row-major, the last dimension fastest (Megatron's and PyTorch's order)") {
  // 2 x 3: ranks 0 1 2 / 3 4 5.
  CHECK(mesh_groups_along({2, 3}, 0) == Groups{{0, 3}, {1, 4}, {2, 5}});
  CHECK(mesh_groups_along({2, 3}, 1) == Groups{{0, 1, 2}, {3, 4, 5}});
  // pp=2 x dp_replicate=2 x tp=2: tp pairs are consecutive ranks, a pipeline's ranks 4 apart.
  CHECK(mesh_groups_along({2, 2, 2}, 2) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(mesh_groups_along({2, 2, 2}, 1) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(mesh_groups_along({2, 2, 2}, 0) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // A dimension of one: a group per rank.
  CHECK(mesh_groups_along({3, 1}, 1) == Groups{{0}, {1}, {2}});
  // PipelineMesh's layout for 2 replicas of a 3-rank pipeline: rank r is position r / 2 of replica r % 2.
  CHECK(mesh_groups_along({3, 2}, 0) == Groups{{0, 2, 4}, {1, 3, 5}});
  CHECK(mesh_groups_along({3, 2}, 1) == Groups{{0, 1}, {2, 3}, {4, 5}});
  CHECK_THROWS_WITH_AS(mesh_groups_along({2, 2}, 2), doctest::Contains("dimension 2 of a 2-dimensional mesh"), Error);
}

TEST_CASE("ParallelPlan: the rest filled in, the mesh's dimensions, and errors naming the plan and the world") {
  const ParallelPlan ddp = ParallelPlan{}.resolved(4);
  CHECK(!ddp.pipelined());
  CHECK(ddp.dp_replicate == 4);
  REQUIRE(ddp.dimensions().size() == 1);
  CHECK(ddp.dimensions()[0].name == "dp_replicate");
  const ParallelPlan one = ParallelPlan{}.resolved(1);
  REQUIRE(one.dimensions().size() == 1);  // DDP over a world of one still has its dimension
  CHECK(one.dimensions()[0].size == 1);

  const ParallelPlan piped = ParallelPlan{.pp = ParallelPlan::kRest, .dp_replicate = 2}.resolved(6);
  CHECK(piped.pp == 3);
  REQUIRE(piped.dimensions().size() == 2);
  CHECK(piped.dimensions()[0].name == "pp");
  CHECK(piped.dimensions()[1].name == "dp_replicate");
  // A pipeline of one rank (an elastic job that shrank) keeps its pp dimension; one replica
  // adds no dimension.
  const ParallelPlan single_stage = ParallelPlan{.pp = ParallelPlan::kRest, .dp_replicate = 1}.resolved(1);
  REQUIRE(single_stage.dimensions().size() == 1);
  CHECK(single_stage.dimensions()[0].name == "pp");
  CHECK(ParallelPlan{.pp = 2, .dp_replicate = 3}.resolved(6).str() == "pp=2 x dp_replicate=3");

  using doctest::Contains;
  CHECK_THROWS_WITH_AS(ParallelPlan({.pp = ParallelPlan::kRest, .dp_replicate = 4}).resolved(6),
                       Contains("pp=rest x dp_replicate=4 does not fit the job's 6 ranks"), Error);
  CHECK_THROWS_WITH_AS(ParallelPlan({.pp = 2, .dp_replicate = 2}).resolved(8), Contains("the sizes multiply to 4"),
                       Error);
  CHECK_THROWS_WITH_AS(ParallelPlan({.pp = ParallelPlan::kRest, .dp_replicate = ParallelPlan::kRest}).resolved(4),
                       Contains("at most one size is the rest"), Error);
  CHECK_THROWS_WITH_AS(ParallelPlan({.pp = -3}).resolved(4), Contains("sizes are >= 1"), Error);
  CHECK_THROWS_WITH_AS(ParallelPlan({.dp_replicate = 0}).resolved(4), Contains("dp_replicate is at least 1"), Error);
  CHECK_THROWS_WITH_AS(ParallelPlan{}.dimensions(), Contains("resolve the plan"), Error);
}

TEST_CASE("DeviceMesh over Gloo ranks: coordinates, a group per dimension, an all-reduce along each") {
  if (test::skip_without_gloo()) return;
  for (int world : {2, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({WEFT_PROCESS_GROUP_WORKER, "mesh"}, world, std::chrono::seconds(90)));
  }
}
