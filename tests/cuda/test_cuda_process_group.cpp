// The nccl backend across processes (CUDA suite: skipped without a GPU): the same workers as
// test_process_group, test_ddp and test_pipeline, with WEFT_TEST_BACKEND=nccl, so every
// collective, reduce op and dtype, the ring all-reduce over NCCL's sends and receives, a dead
// peer, DDP's (a TrainLoop resumed on another world size too, SyncBatchNorm,
// ZeroRedundancyOptimizer) and a multi-process pipeline's equivalence with one process are
// checked on CUDA tensors. With fewer GPUs than ranks the ranks share them, each with its own
// NCCL_HOSTID and NCCL over sockets on loopback (what weft-run sets up; docs/design.md, pitfalls).
#include "test_util.h"

#include <filesystem>
#include <unistd.h>

#include "parallel/process_group/process_group_nccl.h"
#include "spawn_ranks.h"
#include "trace_reading.h"

using namespace weft;

namespace {

std::vector<std::map<std::string, std::string>> nccl_rank_envs(int world,
                                                               std::map<std::string, std::string> extra = {}) {
  const int port = test::free_port();
  const bool share = world > cuda_physical_device_count();
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < world; ++r) {
    auto env = test::torchrun_env(r, world, port);
    env["WEFT_TEST_BACKEND"] = "nccl";
    if (share) {
      env["NCCL_HOSTID"] = "weft-test-rank" + std::to_string(r);
      env["NCCL_SOCKET_IFNAME"] = "lo";
      env["NCCL_NET"] = "Socket";
      env["NCCL_P2P_DISABLE"] = "1";
      env["NCCL_SHM_DISABLE"] = "1";
    }
    for (const auto& [k, v] : extra) env[k] = v;
    envs.push_back(env);
  }
  return envs;
}

bool skip_without_nccl() {
  if (parallel::nccl_available()) return false;
  MESSAGE("skipped: weft was built without NCCL");
  return true;
}

}  // namespace

TEST_CASE("nccl: every collective, reduce op and dtype on CUDA tensors, at world sizes 1, 2 and 4, with sub-groups") {
  if (skip_without_nccl()) return;
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    test::check_all_ok(test::run_processes({WEFT_PROCESS_GROUP_WORKER, "collectives"}, nccl_rank_envs(world),
                                     std::chrono::seconds(240)));
  }
}

TEST_CASE("nccl: the ring all-reduce over NCCL's sends and receives equals NCCL's all-reduce") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_PROCESS_GROUP_WORKER, "ring"}, nccl_rank_envs(3), std::chrono::seconds(240)));
}

TEST_CASE("nccl: connect_peers makes the pairs' communicators one after another; messages then arrive") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_PROCESS_GROUP_WORKER, "connect_peers"}, nccl_rank_envs(3),
                                         std::chrono::seconds(240)));
}

TEST_CASE("nccl: a DeviceMesh over CUDA ranks: coordinates, a group per dimension, an all-reduce along each") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_PROCESS_GROUP_WORKER, "mesh"}, nccl_rank_envs(4),
                                         std::chrono::seconds(240)));
}

TEST_CASE("nccl: a dead peer ends the other rank with a message, or makes its group throw") {
  if (skip_without_nccl()) return;
  // By default the watchdog aborts the communicators and ends the process.
  auto outcomes = test::run_processes({WEFT_PROCESS_GROUP_WORKER, "dead_peer"}, nccl_rank_envs(2),
                                      std::chrono::seconds(120));
  CHECK_MESSAGE(outcomes[0].exit_status == 1, outcomes[0].output);
  CHECK_MESSAGE(outcomes[0].output.find("process group nccl:") != std::string::npos, outcomes[0].output);
  CHECK_MESSAGE(outcomes[0].output.find("ending the process") != std::string::npos, outcomes[0].output);
  // WEFT_NCCL_ASYNC_ERROR_HANDLING=0: the process goes on and the group throws.
  outcomes = test::run_processes({WEFT_PROCESS_GROUP_WORKER, "dead_peer"},
                                 nccl_rank_envs(2, {{"WEFT_NCCL_ASYNC_ERROR_HANDLING", "0"}}), std::chrono::seconds(120));
  test::check_all_ok(outcomes);
  CHECK_MESSAGE(outcomes[0].output.find("the group failed earlier") != std::string::npos, outcomes[0].output);
}

TEST_CASE("nccl: a rank's trace draws its collectives and messages as the GPU ran them, on the channels' lanes") {
  if (skip_without_nccl()) return;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("weft_test_nccl_trace_" + std::to_string(::getpid()))).string();
  test::check_all_ok(
      test::run_processes({WEFT_PROCESS_GROUP_WORKER, "trace", path}, nccl_rank_envs(2), std::chrono::seconds(120)));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const std::string file = path + "." + std::to_string(r);
    const auto reduces = test::traced_spans(file, "all_reduce");
    REQUIRE(reduces.size() == 1);
    CHECK(reduces[0].lane == "nccl (rank " + std::to_string(r) + " of 2)");
    CHECK(reduces[0].dur > 0);  // 4 MiB between two ranks takes the GPU some microseconds at least
    const auto messages = test::traced_spans(file, r == 0 ? "send" : "recv");
    REQUIRE(messages.size() == 1);
    CHECK(messages[0].lane == (r == 0 ? "nccl sends to rank 1" : "nccl receives from rank 0"));
    CHECK(messages[0].ts >= reduces[0].ts + reduces[0].dur - 1);  // after the all-reduce's wait(); 1 us for the events' resolution
    std::filesystem::remove(file);
  }
}

TEST_CASE("nccl: DDP on CUDA ranks equals one process on the whole batch") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "equivalence", "mlp", "sgd"}, nccl_rank_envs(2),
                                   std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "equivalence", "convnet", "adam", "views"}, nccl_rank_envs(2),
                                   std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "partial_use"}, nccl_rank_envs(2), std::chrono::seconds(240)));
}

TEST_CASE("nccl: the fp16, bf16 and PowerSGD hooks transform each gradient as they say, and still train") {
  if (skip_without_nccl()) return;
  for (const char* hook : {"fp16", "bf16"})
    for (int world : {2, 3})
      test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "comm_hook", hook}, nccl_rank_envs(world),
                                             std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "powersgd", "1", "3"}, nccl_rank_envs(2),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "powersgd", "2", "1"}, nccl_rank_envs(2),
                                         std::chrono::seconds(240)));
}

TEST_CASE("nccl: ZeroRedundancyOptimizer on CUDA ranks equals the plain optimizer; its state consolidates exactly") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "zero", "convnet", "adam"}, nccl_rank_envs(2),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "zero", "linear", "sgd"}, nccl_rank_envs(3),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "zero_checkpoint", "mlp", "adam"}, nccl_rank_envs(3),
                                         std::chrono::seconds(240)));
}

TEST_CASE("nccl: DDP join on CUDA ranks with different numbers of batches ends with the reference's model") {
  if (skip_without_nccl()) return;
  // Note [The join's reference] in tests/parallel/ddp/ddp_worker_join.cpp: the join's flags and
  // counts are CUDA tensors here, read back on the host where a rank needs them.
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "join", "bn", "sgd", "2,4,1"}, nccl_rank_envs(3),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "join", "mlp", "zero-adam", "0,3", "active", "micro2"},
                                         nccl_rank_envs(2), std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "join_throw", "3,1,3"}, nccl_rank_envs(3),
                                         std::chrono::seconds(240)));
}

TEST_CASE("nccl: local SGD on CUDA ranks (post-local SGD hook, sub-groups, model averagers) equals the reference") {
  if (skip_without_nccl()) return;
  // Note [Local SGD's reference] in tests/parallel/ddp/ddp_worker_local_sgd.cpp: sub-groups
  // made by new_subgroups are NCCL groups too, and the averages are all-reduces of CUDA buffers.
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "local_sgd", "adam", "2", "3", "2"}, nccl_rank_envs(4),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "local_sgd", "sgd", "2", "2:2,4:4", "machine:2", "micro2"},
                                         nccl_rank_envs(4), std::chrono::seconds(240)));
}

TEST_CASE("nccl: SyncBatchNorm on CUDA ranks equals BatchNorm2d on the whole batch") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "sync_bn", "sgd"}, nccl_rank_envs(2),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "sync_bn_uneven"}, nccl_rank_envs(3),
                                         std::chrono::seconds(240)));
}

TEST_CASE("nccl: a ddp TrainLoop resumed mid-epoch on another world size equals one process") {
  if (skip_without_nccl()) return;
  const std::string checkpoint = (std::filesystem::temp_directory_path() /
                                  ("weft_nccl_elastic_" + std::to_string(::getpid()) + ".safetensors")).string();
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "elastic", "stop", "adam", checkpoint}, nccl_rank_envs(2),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "elastic", "resume", "adam", checkpoint, "2"},
                                         nccl_rank_envs(3), std::chrono::seconds(240)));
  std::filesystem::remove(checkpoint);
}

TEST_CASE("nccl: a ddp TrainLoop with local SGD resumed on another world size equals its replicas in one process") {
  if (skip_without_nccl()) return;
  // Note [Local SGD's TrainLoop reference] in tests/parallel/ddp/ddp_worker_training.cpp: the
  // replicas' parameters and optimizer state averaged as CUDA buffers over NCCL.
  const std::string checkpoint = (std::filesystem::temp_directory_path() /
                                  ("weft_nccl_local_sgd_" + std::to_string(::getpid()) + ".safetensors")).string();
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "elastic_local_sgd", "stop", "adam", checkpoint},
                                         nccl_rank_envs(3), std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_DDP_WORKER, "elastic_local_sgd", "resume", "adam", checkpoint, "3"},
                                         nccl_rank_envs(2), std::chrono::seconds(240)));
  std::filesystem::remove(checkpoint);
}

TEST_CASE("nccl: a pipeline with a stage per CUDA rank equals one device") {
  if (skip_without_nccl()) return;
  test::check_all_ok(test::run_processes({WEFT_PIPELINE_WORKER, "1f1b", "4"}, nccl_rank_envs(2), std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_PIPELINE_WORKER, "interleaved", "4", "2"}, nccl_rank_envs(2),
                                   std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_PIPELINE_WORKER, "1f1b", "4", "1", "always"}, nccl_rank_envs(2),
                                         std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes({WEFT_PIPELINE_WORKER, "buffers"}, nccl_rank_envs(2), std::chrono::seconds(240)));
  // balance_by measured on rank 0's GPU (by_time synchronises it) and broadcast over NCCL.
  test::check_all_ok(test::run_processes({WEFT_PIPELINE_WORKER, "balance"}, nccl_rank_envs(2), std::chrono::seconds(240)));
}

TEST_CASE("nccl: a pipeline TrainLoop resumed on another number of CUDA ranks equals one device") {
  if (skip_without_nccl()) return;
  // Note [A pipeline TrainLoop resumed on other ranks] in tests/parallel/pipeline/pipeline_worker.cpp:
  // the loss, the outputs, the stages and the optimizer state broadcast as CUDA tensors over NCCL.
  const std::string checkpoint = (std::filesystem::temp_directory_path() /
                                  ("weft_nccl_pipeline_loop_" + std::to_string(::getpid()) + ".st")).string();
  test::check_all_ok(test::run_processes(
      {WEFT_PIPELINE_WORKER, "loop", "first", "adam", "1f1b", "4", "1", checkpoint, "1"}, nccl_rank_envs(2),
      std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes(
      {WEFT_PIPELINE_WORKER, "loop", "rest", "adam", "gpipe", "2", "1", checkpoint, "1"}, nccl_rank_envs(3),
      std::chrono::seconds(240)));
  // Replicated (Note [Replicated pipelines in the TrainLoop]): 2 pipelines of 2 CUDA ranks, their
  // gradients averaged over NCCL sub-groups, resumed as 2 replicas of one rank.
  test::check_all_ok(test::run_processes(
      {WEFT_PIPELINE_WORKER, "loop", "first", "sgd", "1f1b", "2", "1", checkpoint, "2"}, nccl_rank_envs(4),
      std::chrono::seconds(240)));
  test::check_all_ok(test::run_processes(
      {WEFT_PIPELINE_WORKER, "loop", "rest", "sgd", "gpipe", "2", "1", checkpoint, "2"}, nccl_rank_envs(2),
      std::chrono::seconds(240)));
  test::check_all_ok(
      test::run_processes({WEFT_PIPELINE_WORKER, "replica-buffers"}, nccl_rank_envs(4), std::chrono::seconds(240)));
  std::filesystem::remove(checkpoint);
}

TEST_CASE("nccl: replicated pipelines average their stages during the backward, equal one device") {
  if (skip_without_nccl()) return;
  // Note [Replicated stages]: the buckets' all-reduces over one NCCL communicator launched while
  // the pipeline's sends and receives run over others, for both schedules.
  for (const char* schedule : {"1f1b", "interleaved"}) {
    CAPTURE(schedule);
    test::check_all_ok(test::run_processes({WEFT_PIPELINE_WORKER, "two-dimensions", schedule}, nccl_rank_envs(4),
                                           std::chrono::seconds(240)));
  }
}
