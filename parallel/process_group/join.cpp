// Join: the announcement of each iteration, and the loop of a rank that ran out.
#include "parallel/process_group/join.h"

#include <algorithm>
#include <atomic>
#include <iostream>
#include <string>

#include "core/error.h"
#include "core/trace.h"

namespace weft::parallel {

namespace {

std::atomic<int> running_joins{0};

// The announcement and the loop's answer to it: one int64 all-reduce, 1 from each rank still
// iterating and 0 from each that ran out.
Tensor count_of(int64_t mine, Device device) { return tensor(std::vector<int64_t>{mine}, Shape{1}).to(device); }

// throw_on_early_termination's second all-reduce: a flag per rank, set by the ranks that ran out.
Tensor ran_out_flags(const ProcessGroup& group, bool ran_out, Device device) {
  std::vector<int64_t> flags(group.size(), 0);
  if (ran_out) flags[group.rank()] = 1;
  return tensor(flags, Shape{group.size()}).to(device);
}

std::string ranks_flagged(const Tensor& flags) {
  std::string list;
  const auto v = flags.to_vector<int64_t>();
  for (size_t r = 0; r < v.size(); ++r)
    if (v[r] != 0) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return list;
}

}  // namespace

int64_t ActiveRanks::wait() {
  work_->wait();
  return count_.to_vector<int64_t>().front();
}

std::optional<ActiveRanks> Joinable::notify_join_context() {
  if (!first_in_join()) return std::nullopt;
  ProcessGroup& group = join_process_group();
  const Device device = join_device();
  Tensor one = count_of(1, device);
  ActiveRanks active(group.all_reduce(one, ReduceOp::Sum), one);
  if (config_.options.throw_on_early_termination) {
    Tensor flags = ran_out_flags(group, false, device);
    group.all_reduce(flags, ReduceOp::Sum)->wait();
    const std::string ran_out = ranks_flagged(flags);
    if (!ran_out.empty()) {
      active.wait();
      WEFT_FAIL("join (rank ", group.rank(), "): rank(s) ", ran_out, " ran out of inputs before this one, and the "
                "join was made with throw_on_early_termination, so every rank stops here");
    }
  }
  return active;
}

void join(const std::vector<Joinable*>& joinables, const std::function<void()>& body, const JoinOptions& options) {
  WEFT_CHECK(!joinables.empty(), "join: no joinables (give it the DistributedDataParallel module, and the "
             "ZeroRedundancyOptimizer if there is one)");
  for (size_t k = 0; k < joinables.size(); ++k) {
    Joinable* j = joinables[k];
    WEFT_CHECK(j != nullptr, "join: a joinable is null");
    WEFT_CHECK(std::find(joinables.begin(), joinables.begin() + k, j) == joinables.begin() + k,
               "join: joinable ", k, " is listed twice");
    WEFT_CHECK(&j->join_process_group() == &joinables.front()->join_process_group(),
               "join: the joinables use different process groups; a join runs over one group");
    WEFT_CHECK(!j->config_.active, "join: a joinable is already inside a join (joins do not nest)");
  }
  if (!options.enable) {
    body();
    return;
  }
  // The joinables know they are in a join while the hooks are made and the body and the
  // hooks run, and not after, also when something throws.
  struct Scope {
    const std::vector<Joinable*>& joinables;
    ~Scope() {
      for (Joinable* j : joinables) j->config_ = {};
      --running_joins;
    }
  } scope{joinables};
  ++running_joins;
  for (size_t k = 0; k < joinables.size(); ++k) joinables[k]->config_ = {true, k == 0, options};
  std::vector<std::unique_ptr<JoinHook>> hooks;
  for (Joinable* j : joinables) hooks.push_back(j->join_hook(options));

  body();  // an exception leaves here, without shadowing (the others stop at their timeout)

  ProcessGroup& group = joinables.front()->join_process_group();
  const Device device = joinables.front()->join_device();
  bool is_last_joiner = true;
  int64_t shadowed = 0;
  const int64_t kSkewWarning = 1000;
  TraceSpan span("join: shadowing", device);
  while (true) {
    Tensor zero = count_of(0, device);
    group.all_reduce(zero, ReduceOp::Sum)->wait();
    const int64_t active = zero.to_vector<int64_t>().front();
    if (active == 0) break;
    if (options.throw_on_early_termination) {
      Tensor flags = ran_out_flags(group, true, device);
      group.all_reduce(flags, ReduceOp::Sum)->wait();
      WEFT_FAIL("join (rank ", group.rank(), "): this rank ran out of inputs while ", active, " other(s) had more, "
                "and the join was made with throw_on_early_termination, so every rank stops here (ranks that ran "
                "out together: ", ranks_flagged(flags), ")");
    }
    JoinRound round{active};
    for (auto& hook : hooks) hook->main_hook(round);
    is_last_joiner = false;
    if (++shadowed == kSkewWarning)
      std::cerr << "weft: join: rank " << group.rank() << " has shadowed " << kSkewWarning << " iterations of ranks "
                << "with more inputs; inputs this uneven leave this rank idle that long\n";
  }
  for (auto& hook : hooks) hook->post_hook(is_last_joiner);
}

bool join_running() { return running_joins.load() > 0; }

}  // namespace weft::parallel
