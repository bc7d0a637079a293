// Process groups across processes: ranks run as local processes over loopback (Gloo on the
// CPU), each checking every collective against a serial computation
// (process_group_worker.cpp); the rendezvous from torchrun's, Slurm's and Open MPI's
// variables set by hand, and from a real mpirun when Open MPI is installed; a rank that
// never arrives, a peer that dies, and mismatched collectives in debug mode.
#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "gloo_suite.h"
#include "parallel/launch/launch_env.h"
#include "parallel/process_group/process_group_gloo.h"
#include "spawn_ranks.h"
#include "trace_reading.h"

using namespace weft;
using doctest::Contains;

namespace {

const std::string worker = WEFT_PROCESS_GROUP_WORKER;

}  // namespace

TEST_CASE("every collective, reduce op and dtype, at world sizes 1 to 4, with sub-groups") {
  if (test::skip_without_gloo()) return;
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "collectives"}, world, std::chrono::seconds(90)));
  }
}

TEST_CASE("the ring all-reduce equals Gloo's at world sizes 2, 3 and 4; WEFT_ALL_REDUCE=ring selects it") {
  if (test::skip_without_gloo()) return;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "ring"}, world, std::chrono::seconds(120)));
  }
  test::check_all_ok(test::run_ranks({worker, "collectives"}, 3, std::chrono::seconds(120), {{"WEFT_ALL_REDUCE", "ring"}}));
}

TEST_CASE("connect_peers exchanges a message per pair, refuses pairs outside the group, skips ranks in none") {
  if (test::skip_without_gloo()) return;
  for (int world : {3, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_ranks({worker, "connect_peers"}, world, std::chrono::seconds(60)));
  }
}

TEST_CASE("env:// reads torchrun's, Slurm's and Open MPI's variables") {
  if (test::skip_without_gloo()) return;
  const int slurm_port = test::free_port(), ompi_port = test::free_port();
  std::vector<std::map<std::string, std::string>> slurm, ompi;
  for (int r = 0; r < 2; ++r) {
    slurm.push_back({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", std::to_string(r)},
                     {"SLURM_JOB_NODELIST", "localhost"}, {"MASTER_PORT", std::to_string(slurm_port)}});
    ompi.push_back({{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"MASTER_PORT", std::to_string(ompi_port)}});
  }
  // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
  for (const auto& named_envs : {std::pair{"Slurm", slurm}, std::pair{"Open MPI", ompi}}) {
    const char* name = named_envs.first;
    const std::vector<std::map<std::string, std::string>>& envs = named_envs.second;
    CAPTURE(name);
    auto outcomes = test::run_processes({worker, "identity"}, envs, std::chrono::seconds(60));
    test::check_all_ok(outcomes);
    for (int r = 0; r < 2; ++r)
      CHECK(outcomes[r].output.find("identity: rank " + std::to_string(r) + " size 2 sum 2") != std::string::npos);
    CHECK(outcomes[0].output.find(std::string("rank and size from ") + name) != std::string::npos);
  }
}

TEST_CASE("a real mpirun -np 2 on loopback") {
  if (test::skip_without_gloo()) return;
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) {
    MESSAGE("skipped: mpirun not found (Debian's openmpi-bin; tools/install-deps installs it)");
    return;
  }
  const int port = test::free_port();
  auto outcomes = test::run_processes(
      {"/bin/sh", "-c",
       "exec mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT=" + std::to_string(port) + " " + worker +
           " identity"},
      {{{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}, {"OMPI_MCA_plm_rsh_agent", ""}}},
      std::chrono::seconds(90));
  REQUIRE(outcomes.size() == 1);
  CHECK_MESSAGE(outcomes[0].exit_status == 0, outcomes[0].output);
  CHECK(outcomes[0].output.find("identity: rank 0 size 2 sum 2") != std::string::npos);
  CHECK(outcomes[0].output.find("identity: rank 1 size 2 sum 2") != std::string::npos);
  CHECK(outcomes[0].output.find("rank and size from Open MPI") != std::string::npos);
}

TEST_CASE("a rank that never arrives is named; a peer that dies fails the others' collective") {
  if (test::skip_without_gloo()) return;
  const int port = test::free_port();
  std::vector<std::map<std::string, std::string>> two_of_three;
  for (int r = 0; r < 2; ++r) two_of_three.push_back(test::torchrun_env(r, 3, port));
  auto missing = test::run_processes({worker, "missing"}, two_of_three, std::chrono::seconds(30));
  test::check_all_ok(missing);
  for (const auto& o : missing) CHECK(o.output.find("rank 2 has not arrived") != std::string::npos);

  auto dead = test::run_ranks({worker, "dead_peer"}, 2, std::chrono::seconds(30));
  test::check_all_ok(dead);
  CHECK(dead[0].output.find("error: ProcessGroupGloo all_reduce (rank 0 of 2)") != std::string::npos);
}

TEST_CASE("a rank's trace draws its group's collectives on the group's lane") {
  if (test::skip_without_gloo()) return;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("weft_test_pg_trace_" + std::to_string(::getpid()))).string();
  test::check_all_ok(test::run_ranks({worker, "trace", path}, 2, std::chrono::seconds(60)));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto spans = test::traced_spans(path + "." + std::to_string(r), "all_reduce");
    REQUIRE(spans.size() == 1);
    CHECK(spans[0].lane == "gloo (rank " + std::to_string(r) + " of 2)");
    CHECK(spans[0].dur > 0);
    std::filesystem::remove(path + "." + std::to_string(r));
  }
}

TEST_CASE("monitored_barrier names the ranks that did not reach it, on every rank that did") {
  if (test::skip_without_gloo()) return;
  // Every rank passes a first barrier; the ranks listed skip the second (timeout 500 ms).
  auto one = test::run_ranks({worker, "monitored_barrier", "2"}, 3, std::chrono::seconds(60));
  test::check_all_ok(one);
  for (int r : {0, 1})
    CHECK_MESSAGE(one[r].output.find("error: monitored_barrier: rank 2 did not reach the barrier within 500 ms (the "
                                     "first missing") != std::string::npos,
                  one[r].output);
  auto all = test::run_ranks({worker, "monitored_barrier", "1,3", "all"}, 4, std::chrono::seconds(60));
  test::check_all_ok(all);
  for (int r : {0, 2})
    CHECK_MESSAGE(all[r].output.find("error: monitored_barrier: ranks 1, 3 did not reach the barrier within 500 ms\n") !=
                      std::string::npos,
                  all[r].output);
  auto no_root = test::run_ranks({worker, "monitored_barrier", "0"}, 2, std::chrono::seconds(60));
  test::check_all_ok(no_root);
  CHECK_MESSAGE(no_root[1].output.find("error: monitored_barrier: rank 1 arrived, but rank 0 did not release the "
                                       "barrier within 1000 ms") != std::string::npos,
                no_root[1].output);
}

TEST_CASE("WEFT_DISTRIBUTED_DEBUG=1: mismatched collectives fail on every rank, naming both calls") {
  if (test::skip_without_gloo()) return;
  auto outcomes = test::run_ranks({worker, "mismatch"}, 3, std::chrono::seconds(30), {{"WEFT_DISTRIBUTED_DEBUG", "1"}});
  test::check_all_ok(outcomes);
  for (const auto& o : outcomes)
    CHECK_MESSAGE(o.output.find("collective mismatch at call 0 of the group: rank 0 called all_reduce(float32 [4], "
                                "sum) but rank ") != std::string::npos,
                  o.output);
  CHECK(outcomes[1].output.find("called all_reduce(float32 [5], sum)") != std::string::npos);
}

TEST_CASE("launch environment parsing") {
  CHECK(parallel::first_slurm_host("node[01-04,07],gpu1") == "node01");
  CHECK(parallel::first_slurm_host("gpu-a,gpu-b") == "gpu-a");
  CHECK(parallel::first_slurm_host("n[3]x") == "n3x");
  CHECK(parallel::first_slurm_host("single") == "single");
  CHECK(parallel::parse_int_in("29500", 1, 65535) == 29500);
  for (const char* bad : {"", "+1", " 1", "1 ", "1x", "0", "65536", "-3", "99999999999"})
    CHECK_MESSAGE(!parallel::parse_int_in(bad, 1, 65535), bad);
  CHECK(parallel::split_host_port("node01:29500") == std::make_pair(std::string("node01"), 29500));
  CHECK(parallel::split_host_port("::1:80") == std::make_pair(std::string("::1"), 80));  // split at the last ':'
  for (const char* bad : {"node01", ":29500", "node01:", "node01:0", "node01:65536", "node01:80x"})
    CHECK_MESSAGE(!parallel::split_host_port(bad), bad);
  CHECK_THROWS_WITH_AS(parallel::init_process_group("gloo", {.init_method = "tcp://node01:http", .rank = 0,
                                                             .world_size = 1}),
                       doctest::Contains("init_method 'tcp://node01:http' should be tcp://HOST:PORT with a port from 1 "
                                         "to 65535"),
                       Error);
}
