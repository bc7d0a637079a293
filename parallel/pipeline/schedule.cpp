// Pipeline schedules: the built-in ones, their table, and the validator; see schedule.h.
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace weft::parallel::pipeline {

namespace {

const char* kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::SendForward: return "SEND_F";
    case ActionKind::RecvForward: return "RECV_F";
    case ActionKind::SendBackward: return "SEND_B";
    case ActionKind::RecvBackward: return "RECV_B";
  }
  return "?";
}

Action forward(int stage, int mb) { return {ActionKind::Forward, stage, mb}; }
Action backward(int stage, int mb) { return {ActionKind::Backward, stage, mb}; }

void check_sizes(const char* what, int ranks, int micro_batches) {
  WEFT_CHECK(ranks >= 1, what, ": a pipeline needs at least 1 stage, got ", ranks);
  WEFT_CHECK(micro_batches >= 1, what, ": at least 1 micro-batch, got ", micro_batches);
}

// One action of a rank's list, for messages: "rank 1's action 4 (2B0)".
std::string where(int rank, size_t index, const Action& a) {
  return "rank " + std::to_string(rank) + "'s action " + std::to_string(index) + " (" + a.str() + ")";
}

// The send whose message `recv` receives, and the receive of `send`'s message.
Action matching_send(const Action& recv) {
  return recv.kind == ActionKind::RecvForward ? Action{ActionKind::SendForward, recv.stage - 1, recv.micro_batch}
                                              : Action{ActionKind::SendBackward, recv.stage + 1, recv.micro_batch};
}
Action matching_recv(const Action& send) {
  return send.kind == ActionKind::SendForward ? Action{ActionKind::RecvForward, send.stage + 1, send.micro_batch}
                                              : Action{ActionKind::RecvBackward, send.stage - 1, send.micro_batch};
}

using Key = std::tuple<ActionKind, int, int>;
Key key(const Action& a) { return {a.kind, a.stage, a.micro_batch}; }

// Each rank's list on its own: ranges, placement, and the order of what depends on what.
void check_rank_lists(const Schedule& s) {
  const std::string name = "pipeline schedule '" + s.name + "'";
  const int S = s.num_stages, m = s.num_micro_batches;
  for (int r = 0; r < s.num_ranks(); ++r) {
    std::set<Key> seen;
    const auto& list = s.actions[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const std::string at = name + ": " + where(r, i, a);
      WEFT_CHECK(a.stage >= 0 && a.stage < S, at, ": stage ", a.stage, " is not one of the ", S, " stages");
      WEFT_CHECK(a.micro_batch >= 0 && a.micro_batch < m, at, ": micro-batch ", a.micro_batch, " is not one of the ",
                 m, " micro-batches");
      WEFT_CHECK(s.rank_of(a.stage) == r, at, ": stage ", a.stage, " lives on rank ", s.rank_of(a.stage));
      WEFT_CHECK(!seen.count(key(a)), at, ": repeated");
      const bool first = a.stage == 0, last = a.stage == S - 1;
      const auto done = [&](ActionKind kind) { return seen.count({kind, a.stage, a.micro_batch}) > 0; };
      const std::string mb = std::to_string(a.micro_batch), st = std::to_string(a.stage);
      switch (a.kind) {
        case ActionKind::Forward:
          WEFT_CHECK(first || done(ActionKind::RecvForward), at, ": a forward before the receive of its input (",
                     st, "RECV_F", mb, ")");
          break;
        case ActionKind::Backward:
          WEFT_CHECK(done(ActionKind::Forward), at, ": a backward before its forward (", st, "F", mb, ")");
          WEFT_CHECK(last || done(ActionKind::RecvBackward), at,
                     ": a backward before the receive of its output's gradient (", st, "RECV_B", mb, ")");
          break;
        case ActionKind::SendForward:
          WEFT_CHECK(!last, at, ": the last stage has no next stage to send to");
          WEFT_CHECK(done(ActionKind::Forward), at, ": sends the output of a forward not run yet (", st, "F", mb, ")");
          break;
        case ActionKind::SendBackward:
          WEFT_CHECK(!first, at, ": the first stage has no previous stage to send to");
          WEFT_CHECK(done(ActionKind::Backward), at, ": sends the gradient of a backward not run yet (", st, "B", mb,
                     ")");
          break;
        case ActionKind::RecvForward:
          WEFT_CHECK(!first, at, ": the first stage receives no activations (its input is the batch)");
          break;
        case ActionKind::RecvBackward:
          WEFT_CHECK(!last, at, ": the last stage receives no gradient (its backward starts from the loss)");
          break;
      }
      seen.insert(key(a));
    }
  }
}

// Every forward and backward once; every send with its receive and the other way round.
void check_completeness(const Schedule& s) {
  const std::string name = "pipeline schedule '" + s.name + "'";
  std::set<Key> all;
  for (const auto& list : s.actions)
    for (const Action& a : list) all.insert(key(a));
  for (int stage = 0; stage < s.num_stages; ++stage)
    for (int i = 0; i < s.num_micro_batches; ++i)
      for (const Action& a : {forward(stage, i), backward(stage, i)})
        WEFT_CHECK(all.count(key(a)), name, ": rank ", s.rank_of(stage), " never runs ", a.str());
  for (int r = 0; r < s.num_ranks(); ++r) {
    const auto& list = s.actions[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward) {
        const Action recv = matching_recv(a);
        WEFT_CHECK(all.count(key(recv)), name, ": ", where(r, i, a), " has no receive: rank ", s.rank_of(recv.stage),
                   " never runs ", recv.str());
      } else if (a.kind == ActionKind::RecvForward || a.kind == ActionKind::RecvBackward) {
        const Action send = matching_send(a);
        WEFT_CHECK(all.count(key(send)), name, ": ", where(r, i, a), " has no send: rank ", s.rank_of(send.stage),
                   " never runs ", send.str());
      }
    }
  }
}

// Replays the schedule, computations taking one step and sends not waiting; calls
// on_compute(rank, step, action) for each computation. Returns the blocked receives when
// the ranks wait for each other for ever (rank, index), else nothing.
template <class OnCompute>
std::vector<std::pair<int, size_t>> replay(const Schedule& s, OnCompute&& on_compute) {
  const int R = s.num_ranks();
  std::vector<size_t> next(R, 0);
  std::vector<int> clock(R, 0);
  std::map<Key, int> sent_at;  // a send's message -> the step from which it can be received
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      for (; next[r] < s.actions[r].size(); ++next[r]) {
        const Action& a = s.actions[r][next[r]];
        if (a.is_computation()) {
          on_compute(r, clock[r], a);
          ++clock[r];
        } else if (a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward) {
          sent_at[key(a)] = clock[r];
        } else {
          auto it = sent_at.find(key(matching_send(a)));
          if (it == sent_at.end()) break;  // waits for its send
          clock[r] = std::max(clock[r], it->second);
        }
        progress = true;
      }
    }
  }
  std::vector<std::pair<int, size_t>> blocked;
  for (int r = 0; r < R; ++r)
    if (next[r] < s.actions[r].size()) blocked.emplace_back(r, next[r]);
  return blocked;
}

void check_no_cyclic_wait(const Schedule& s) {
  const auto blocked = replay(s, [](int, int, const Action&) {});
  if (blocked.empty()) return;
  std::ostringstream why;
  why << "pipeline schedule '" << s.name << "': a cyclic wait: ";
  for (size_t k = 0; k < blocked.size(); ++k) {
    const auto [r, i] = blocked[k];
    const Action& a = s.actions[r][i];
    const Action send = matching_send(a);
    why << (k ? "; " : "") << where(r, i, a) << " waits for " << send.str() << " on rank "
        << s.rank_of(send.stage);
  }
  why << " (receives wait for their sends; every one of these ranks waits for another)";
  WEFT_FAIL(why.str());
}

std::string cell(const Schedule& s, const Action& a) {
  const std::string text = std::string(kind_name(a.kind)) + std::to_string(a.micro_batch);
  return s.num_stages == s.num_ranks() ? text : std::to_string(a.stage) + text;
}

}  // namespace

std::string Action::str() const { return std::to_string(stage) + kind_name(kind) + std::to_string(micro_batch); }

std::vector<Action> with_communication(const std::vector<Action>& computations, int num_stages) {
  std::vector<Action> out;
  for (const Action& a : computations) {
    const bool first = a.stage == 0, last = a.stage == num_stages - 1;
    if (a.kind == ActionKind::Forward) {
      if (!first) out.push_back({ActionKind::RecvForward, a.stage, a.micro_batch});
      out.push_back(a);
      if (!last) out.push_back({ActionKind::SendForward, a.stage, a.micro_batch});
    } else if (a.kind == ActionKind::Backward) {
      if (!last) out.push_back({ActionKind::RecvBackward, a.stage, a.micro_batch});
      out.push_back(a);
      if (!first) out.push_back({ActionKind::SendBackward, a.stage, a.micro_batch});
    } else {
      out.push_back(a);
    }
  }
  return out;
}

Schedule gpipe(int stages, int micro_batches) {
  check_sizes("gpipe", stages, micro_batches);
  Schedule s{"gpipe", stages, micro_batches, {}};
  for (int r = 0; r < stages; ++r) {
    std::vector<Action> compute;
    for (int i = 0; i < micro_batches; ++i) compute.push_back(forward(r, i));
    for (int i = 0; i < micro_batches; ++i) compute.push_back(backward(r, i));
    s.actions.push_back(with_communication(compute, stages));
  }
  return s;
}

Schedule one_f_one_b(int stages, int micro_batches) {
  check_sizes("1f1b", stages, micro_batches);
  Schedule s{"1f1b", stages, micro_batches, {}};
  for (int r = 0; r < stages; ++r) {
    // Warm-up: enough forwards to fill the pipeline below this stage; then one forward and
    // one backward in turn; then the backwards left.
    const int warmup = std::min(stages - r - 1, micro_batches);
    std::vector<Action> compute;
    int f = 0, b = 0;
    for (; f < warmup; ++f) compute.push_back(forward(r, f));
    for (; f < micro_batches; ++f, ++b) {
      compute.push_back(forward(r, f));
      compute.push_back(backward(r, b));
    }
    for (; b < micro_batches; ++b) compute.push_back(backward(r, b));
    s.actions.push_back(with_communication(compute, stages));
  }
  return s;
}

Schedule interleaved_one_f_one_b(int ranks, int virtual_stages, int micro_batches) {
  check_sizes("interleaved", ranks, micro_batches);
  WEFT_CHECK(virtual_stages >= 1, "interleaved: at least 1 stage per rank, got ", virtual_stages);
  WEFT_CHECK(micro_batches % ranks == 0, "interleaved: the micro-batches (", micro_batches,
             ") must be a multiple of the ranks (", ranks, "), as in Megatron and torch.distributed.pipelining");
  const int p = ranks, v = virtual_stages, m = micro_batches, total = m * v;
  Schedule s{"interleaved", p * v, m, {}};
  // The k-th forward (backward) of a rank: micro-batches go round the rank's stages in
  // groups of p, forwards from its first stage up, backwards from its last stage down.
  const auto micro_batch = [&](int k) { return (k / (p * v)) * p + k % p; };
  const auto chunk = [&](int k, bool fwd) { return fwd ? (k / p) % v : v - 1 - (k / p) % v; };
  for (int r = 0; r < p; ++r) {
    const int warmup = m == p ? total : std::min(total, (p - r - 1) * 2 + (v - 1) * p);
    std::vector<Action> compute;
    int f = 0, b = 0;
    const auto add_forward = [&] { compute.push_back(forward(chunk(f, true) * p + r, micro_batch(f))), ++f; };
    const auto add_backward = [&] { compute.push_back(backward(chunk(b, false) * p + r, micro_batch(b))), ++b; };
    while (f < warmup) add_forward();
    while (f < total) add_forward(), add_backward();
    while (b < total) add_backward();
    s.actions.push_back(with_communication(compute, p * v));
  }
  return s;
}

Schedule make_schedule(const std::string& name, int ranks, int micro_batches, int virtual_stages) {
  WEFT_CHECK(name == "interleaved" || virtual_stages == 1, "pipeline schedule '", name,
             "': virtual stages (", virtual_stages, ") are for the interleaved schedule only");
  if (name == "gpipe") return gpipe(ranks, micro_batches);
  if (name == "1f1b") return one_f_one_b(ranks, micro_batches);
  if (name == "interleaved") return interleaved_one_f_one_b(ranks, virtual_stages, micro_batches);
  WEFT_FAIL("pipeline schedule '", name, "': unknown (expected gpipe, 1f1b or interleaved)");
}

int micro_batches_for_batch(const std::string& name, int ranks, int micro_batches, int64_t batch) {
  if (batch >= micro_batches) return micro_batches;
  if (name != "interleaved") return static_cast<int>(std::max<int64_t>(batch, 1));
  WEFT_CHECK(batch >= ranks, "pipeline: the interleaved schedule over ", ranks, " ranks needs a multiple of ", ranks,
             " micro-batches of at least one sample each, but a batch has ", batch, " samples (an epoch's short "
             "last batch, per replica when the pipeline is replicated? choose a batch size whose last batch has at "
             "least ", ranks, " samples, or drop it: DataLoaderOptions::drop_last)");
  return static_cast<int>(batch / ranks * ranks);
}

void validate(const Schedule& s) {
  WEFT_CHECK(s.num_ranks() >= 1, "pipeline schedule '", s.name, "': no ranks");
  WEFT_CHECK(s.num_stages >= s.num_ranks() && s.num_stages % s.num_ranks() == 0, "pipeline schedule '", s.name,
             "': ", s.num_stages, " stages cannot be spread evenly over ", s.num_ranks(), " ranks");
  WEFT_CHECK(s.num_micro_batches >= 1, "pipeline schedule '", s.name, "': no micro-batches");
  check_rank_lists(s);
  check_completeness(s);
  check_no_cyclic_wait(s);
}

Timeline timeline(const Schedule& s) {
  validate(s);
  Timeline t;
  t.busy.assign(s.num_ranks(), 0);
  replay(s, [&](int r, int step, const Action&) {
    ++t.busy[r];
    t.steps = std::max(t.steps, step + 1);
  });
  return t;
}

double Timeline::bubble_fraction() const {
  int busy_cells = 0;
  for (int b : busy) busy_cells += b;
  const int cells = steps * static_cast<int>(busy.size());
  return cells == 0 ? 0.0 : 1.0 - static_cast<double>(busy_cells) / cells;
}

std::string Schedule::table() const {
  const Timeline t = timeline(*this);
  std::vector<std::vector<std::string>> grid(num_ranks(), std::vector<std::string>(t.steps, "."));
  size_t width = 1;
  replay(*this, [&](int r, int step, const Action& a) {
    grid[r][step] = cell(*this, a);
    width = std::max(width, grid[r][step].size());
  });
  const bool by_stage = num_stages == num_ranks();
  std::ostringstream out;
  for (int r = 0; r < num_ranks(); ++r) {
    std::string row = (by_stage ? "stage " : "rank ") + std::to_string(r) + ":";
    for (const std::string& c : grid[r]) row += " " + c + std::string(width - c.size(), ' ');
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out << row << "\n";
  }
  return out.str();
}

}  // namespace weft::parallel::pipeline
