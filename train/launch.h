// Starting the ranks of a job from the program itself, and joining it from each rank.
//
// Starting them (as a training script spawns its own processes): a program that finds it was
// not started as a rank runs itself again as `nproc` ranks under weft-run, which sets each
// rank's variables, prefixes their output and stops them all when one fails. In C++ a loop cannot
// fork the program half-way through, so this is called first thing in main:
//
//   int main(int argc, char** argv) {
//     if (!parallel::launched_as_rank()) train::run_as_ranks(2, argc, argv);  // does not return
//     ... the training, as one rank (DistributedStrategy) ...
//   }
#pragma once

#include <optional>
#include <string>

#include "core/device.h"

namespace weft::train {

// A job across machines (num_nodes and node_rank): each node runs the program
// with its node rank, and all of them meet at rank 0's address.
struct NodeOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // "" : weft-run's default (127.0.0.1)
  int master_port = 0;      // 0 : weft-run's default (29500)
};

// Replaces this process with `weft-run --nproc-per-node nproc [node options] PROGRAM
// ARGS...` (this program, /proc/self/exe, with its arguments); never returns: on failure it
// throws. weft-run is looked up in WEFT_RUN, next to this program, next to where weft was
// installed, then on PATH.
[[noreturn]] void run_as_ranks(int nproc, int argc, char** argv, const NodeOptions& nodes = {});

// Where run_as_ranks would find weft-run ("" when nowhere).
std::string find_weft_run();

// This rank's device in a job of several (ddp, the pipeline across processes), after joining
// the job's default group from the launcher's variables (init_process_group with `backend`,
// else nccl for CUDA devices and gloo for the CPU) unless the program has joined one:
// `device` when given, else cuda:LOCAL_RANK (modulo the GPUs) with GPUs, else the CPU.
Device join_job(const std::optional<Device>& device, const std::string& backend);

}  // namespace weft::train
