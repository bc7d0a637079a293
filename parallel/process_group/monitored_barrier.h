// monitored_barrier: a barrier of the default group that names the ranks that did not reach
// it (PyTorch's torch.distributed.monitored_barrier), for finding the rank a job is stuck on.
//
//   parallel::monitored_barrier(std::chrono::seconds(30));   // every rank
//   // on rank 0, and on every rank that arrived, when rank 2 did not within 30 s:
//   //   monitored_barrier: rank 2 did not reach the barrier within 30000 ms
//
// A plain barrier is a collective: when a rank never arrives the others wait until the
// group's timeout and learn only that the barrier failed. Here each rank says through the
// store that it arrived; rank 0 waits for each in turn, up to `timeout` in all, and then
// releases the others, or gives them the failure to throw, so every rank that arrived fails
// with the same message. The others wait for rank 0's answer up to twice the timeout (rank 0
// may arrive up to a timeout after them), then fail naming rank 0. With wait_all_ranks, rank 0
// names every rank missing at the deadline, not only the first. Unlike the collectives, it
// goes through the store, so it works whatever state the backend's connections are in
// (PyTorch's uses Gloo's send and recv).
//
// Every rank of the default group calls it, in the same order as its other monitored
// barriers. After a failure the job's ranks are out of step: end it.
#pragma once

#include <chrono>

namespace weft::parallel {

// `timeout`: zero for the default group's store timeout.
void monitored_barrier(std::chrono::milliseconds timeout = std::chrono::milliseconds(0), bool wait_all_ranks = false);

}  // namespace weft::parallel
