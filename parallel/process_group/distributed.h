// torch.distributed for weft: init_process_group, the default group, sub-groups.
//
// A program written as PyTorch's DDP tutorials write one runs unchanged under weft-run,
// torchrun-style hand-made variables, srun or mpirun:
//
//   parallel::init_process_group("gloo");                 // env:// : RANK, WORLD_SIZE, MASTER_ADDR, ...
//   Tensor t = full({4}, parallel::get_rank());
//   parallel::default_group().all_reduce(t)->wait();     // every rank: 0 + 1 + ... + (size - 1)
//   parallel::destroy_process_group();
//
// Rendezvous: rank 0 serves a TCPStore on MASTER_ADDR:MASTER_PORT (init_method "env://" or
// "tcp://host:port") and every rank connects to it, or they share a FileStore
// ("file:///path", one machine). Each rank then announces itself; a rank that has not
// arrived when the timeout expires makes the others fail with an error naming the missing
// ranks. The backends then connect through the store (Gloo: a full TCP mesh). Under
// weft-run's elastic agents (WEFT_AGENT_STORE_PREFIX set) the store at MASTER_ADDR:PORT is
// theirs: no rank serves it, and each round's group keeps its keys under that prefix.
//
// WEFT_ALL_REDUCE=ring makes the groups' all_reduce weft's own ring (parallel/process_group/ring_allreduce.h)
// instead of the backend's.
//
// WEFT_DISTRIBUTED_DEBUG=1 checks every collective across the ranks before it runs (through
// the store: the op, the dtypes and shapes, the reduce op and the root must agree) and
// reports a mismatch naming both ranks and both calls instead of hanging or computing
// garbage.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/launch/launch_env.h"
#include "parallel/process_group/process_group.h"
#include "parallel/store/store.h"

namespace weft::parallel {

struct InitOptions {
  // "env://" (rank, world size and master from the launcher's variables), "tcp://host:port"
  // or "file:///path/to/shared/file".
  std::string init_method = "env://";
  int rank = -1;        // -1: from the environment (required for tcp:// and file:// otherwise)
  int world_size = -1;  // likewise
  // How long the rendezvous and every collective may take (PyTorch's default: 30 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

// Joins the job's default group; backend "gloo" (CPU tensors). Returns the group.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const InitOptions& options = {});
// Leaves it: collectives queued before are finished or failed first. Rank 0, which serves
// the store, waits (up to 10 s) until every rank has left, so call it on every rank before
// exiting: a rank 0 that exits early takes the store away from ranks still using it.
void destroy_process_group();
bool is_initialized();

// The default group (an error naming init_process_group when there is none).
ProcessGroup& default_group();
// The same, shared: what holds on to the group (DDP does) keeps it alive after
// destroy_process_group.
std::shared_ptr<ProcessGroup> default_group_ptr();
int get_rank();
int get_world_size();
// The store the default group met through (sub-groups and DDP use it too).
std::shared_ptr<Store> default_store();

// A group of some of the default group's ranks (PyTorch's new_group). Every rank of the
// default group must call it, with the same ranks, in the same order of calls; members get
// their group (ranks renumbered in the order given), the others nullptr. `backend`: empty
// for the default group's.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& backend = "");
// The default group cut into groups of `group_size` consecutive ranks (PyTorch's
// new_subgroups): ranks 0 .. size-1, size .. 2 size-1, ...; returns this rank's. 0: one group
// per machine, of LOCAL_WORLD_SIZE ranks (from the launcher; PyTorch counts the GPUs). A size
// that does not divide the world is an error. Every rank of the default group calls it, as
// new_group.
std::shared_ptr<ProcessGroup> new_subgroups(int group_size = 0, const std::string& backend = "");

// A group from a store that the caller provides (tests, launch-free programs): rendezvous,
// then the backend, then the debug check when WEFT_DISTRIBUTED_DEBUG=1.
std::shared_ptr<ProcessGroup> new_group_from_store(const std::string& backend, std::shared_ptr<Store> store, int rank,
                                                   int size, std::chrono::milliseconds timeout,
                                                   const std::string& bind_host = "127.0.0.1");

}  // namespace weft::parallel
