// Starting a multi-process benchmark on one machine: the executable runs itself again as
// `world` ranks with weft-run's variables (bench/allreduce, bench/ddp_overhead), so a
// benchmark needs no launcher, and under one (weft-run, torchrun, srun) it is simply a rank.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cpu/threads.h"
#include "parallel/launch/launch_env.h"
#include "parallel/process_group/process_group_gloo.h"
#include "parallel/process_group/process_group_nccl.h"

namespace weft::bench {

// Whether the ranks' backend is missing here (Gloo for CPU ranks, NCCL and a GPU for CUDA
// ranks); if so, prints the benchmark's "# NAME: skipped: ..." line.
inline bool skipped_without_backend(const char* name, bool cuda) {
  std::string why;
  if (!cuda && !parallel::gloo_available()) why = "weft was built without Gloo";
  if (cuda && !parallel::nccl_available()) {
    const std::string cause = cuda_available() ? "weft was built without NCCL" : cuda_unavailable_reason();
    why = "no GPU with NCCL (" + cause + ")";
  }
  if (!why.empty()) std::cout << "# " << name << ": skipped: " << why << "\n";
  return !why.empty();
}

// Runs `self` with `argv` as `world` local ranks (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR = 127.0.0.1, a free MASTER_PORT) and waits for them; returns
// 1 when one failed. The CPU threads are shared: each rank gets OMP_NUM_THREADS = this
// process's threads / world (at least 1), so that the ranks together do not oversubscribe the
// cores. With `share_gpus` and more ranks than GPUs, each rank also gets its own NCCL_HOSTID
// and NCCL's socket transport over loopback, as weft-run sets (docs/design.md, pitfalls).
inline int run_as_local_ranks(const char* self, char** argv, int world, bool share_gpus = false) {
  const std::string port = std::to_string(parallel::free_loopback_port());
  const std::string threads = std::to_string(std::max(1, num_threads() / world));
  const bool nccl_sockets = share_gpus && world > cuda_physical_device_count();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("OMP_NUM_THREADS", threads.c_str(), 1);
      if (nccl_sockets) {
        ::setenv("NCCL_HOSTID", ("bench-rank" + std::to_string(r)).c_str(), 1);
        ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        ::setenv("NCCL_NET", "Socket", 0);
        ::setenv("NCCL_P2P_DISABLE", "1", 0);
        ::setenv("NCCL_SHM_DISABLE", "1", 0);
      }
      ::execv(self, argv);
      std::perror("bench: exec");
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}

}  // namespace weft::bench
