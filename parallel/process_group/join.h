// Join: training on uneven inputs (PyTorch's torch.distributed.algorithms.Join and
// DistributedDataParallel.join).
//
// Every collective needs every rank. When one rank's loader runs out a batch before the
// others' (a sampler that does not pad, a dataset split unevenly), its peers' next
// all-reduce waits for it until the group's timeout. Inside a join, a rank that has run out
// instead *shadows* the others: for each iteration they still run, it makes the same
// collectives they make, contributing zeros (PowerSGD's error feedback adds its residual),
// until every rank has run out.
//
//   parallel::join({ddp.get()}, [&] {
//     for (const data::Batch& batch : loader) {      // a different number of batches per rank
//       sgd.zero_grad();
//       cross_entropy((*ddp)(batch.data), batch.target).backward();
//       sgd.step();
//     }
//   });                                              // returns on every rank together
//
// How the ranks stay in step: each training iteration of a rank still in the body begins
// with one all-reduce of 1 (notify_join_context(), from the first joinable's forward or
// step). A rank out of inputs loops: it all-reduces 0 with them, and while the sum (the
// number of ranks still iterating) is not 0 it runs every joinable's main_hook, which makes
// the rest of that iteration's collectives. When the sum is 0, every rank runs each
// post_hook, told whether it was among the last to run out (those hold the newest model).
//
// Options (a Join's options reach every joinable's hook):
//   enable: false runs the body as it is (the same code with and without uneven inputs);
//   throw_on_early_termination: instead of shadowing, the first rank to run out makes every
//     rank throw at its next iteration, naming the ranks that ran out;
//   divide_by_initial_world_size: DistributedDataParallel's: gradients averaged over the
//     group's size, the ranks that ran out contributing zeros (true, PyTorch's default), or
//     over the ranks still iterating (false: their samples weigh more).
//
// The body's contract: each iteration makes its collectives through the joinables (a rank
// that ran out can shadow only what they announce: no SyncBatchNorm, no all-reduce of the
// loss in the loop), and every forward through DDP with grad mode on is followed by its
// backward. Evaluation forwards (grad mode off) make no collectives and can be run freely.
// An exception in the body leaves at once, without the shadowing (as PyTorch's context
// manager does); the others then stop at their timeout.
//
// The order of the joinables: DistributedDataParallel first (one per join; it announces the
// iterations), then an optimizer that steps on its gradients (ZeroRedundancyOptimizer).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "parallel/process_group/process_group.h"

namespace weft::parallel {

struct JoinOptions {
  bool enable = true;
  bool throw_on_early_termination = false;
  bool divide_by_initial_world_size = true;
};

// One iteration of the ranks still iterating, as the hooks of a rank that ran out see it, in
// the joinables' order: what one hook learns, the next can use.
struct JoinRound {
  int64_t active = 0;              // ranks still iterating
  // The others' backward reduced their gradients: false when DDP's hook finds it ran under
  // no_sync (an optimizer steps after a reduced backward only).
  bool gradients_reduced = true;
};

// What a rank that ran out does in place of one iteration (main_hook), and once every rank
// has run out (post_hook).
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // The collectives of one iteration of the ranks still iterating.
  virtual void main_hook(JoinRound& round) { (void)round; }
  // Every rank, after the last iteration: is_last_joiner is true on the ranks that ran out
  // last (they did not shadow anything).
  virtual void post_hook(bool is_last_joiner) { (void)is_last_joiner; }
};

// The number of ranks still iterating, as an all-reduce in flight.
class ActiveRanks {
 public:
  ActiveRanks(std::shared_ptr<Work> work, Tensor count) : work_(std::move(work)), count_(std::move(count)) {}
  int64_t wait();

 private:
  std::shared_ptr<Work> work_;
  Tensor count_;
};

// A participant of a join: DistributedDataParallel, ZeroRedundancyOptimizer.
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // Where the join's own all-reduces run (every joinable of a join must share the group).
  virtual Device join_device() const = 0;
  virtual ProcessGroup& join_process_group() const = 0;

  // Inside a join's body (until it returns), with the join's options.
  bool in_join() const { return config_.active; }
  const JoinOptions& join_options() const { return config_.options; }

 protected:
  // At the start of each iteration's collectives: on the join's first joinable, inside a
  // join, announces this rank's iteration (and, with throw_on_early_termination, throws if
  // a rank ran out); returns the number of ranks iterating, in flight. Elsewhere it does
  // nothing and returns nothing.
  std::optional<ActiveRanks> notify_join_context();
  bool first_in_join() const { return config_.active && config_.first; }

 private:
  friend void join(const std::vector<Joinable*>&, const std::function<void()>&, const JoinOptions&);
  struct Config {
    bool active = false;
    bool first = false;
    JoinOptions options;
  };
  Config config_;
};

// Runs `body` inside a join of `joinables` (PyTorch: `with Join(joinables, ...): body`).
// Returns when every rank of their group has left its body. Hooks run in the order of
// `joinables`: DDP before the optimizer that steps on its gradients.
void join(const std::vector<Joinable*>& joinables, const std::function<void()>& body, const JoinOptions& options = {});

// Whether a join (with `enable`) is running on this process: its body, or a rank that ran out
// shadowing the others. What cannot be shadowed checks it to refuse with a message rather than
// put the ranks' collectives out of step (local SGD's averaging: parallel/optim/model_averaging.h).
bool join_running();

}  // namespace weft::parallel
