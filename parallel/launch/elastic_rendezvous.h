// ElasticRendezvous: how the agents of an elastic job (weft-run --nnodes MIN:MAX, one agent
// per node) agree on who trains in each round (torchelastic's dynamic rendezvous, over any
// Store: in practice the TCPStore at --rdzv-endpoint).
//
// Note [Elastic rounds]
// A job is a sequence of rounds. Each round has a fixed membership (agents, in join order:
// the node ranks) and runs one group of workers. Everything lives under "rdzv/<job>/" in
// the store:
//   round              the open or running round N (a decimal integer; missing = 0)
//   r<N>/joined        join counter: the k-th agent to add 1 holds slot k-1
//   r<N>/node/<k>      slot k's NodeInfo ("id nproc host")
//   r<N>/closed        the number of members M, written once with compare_set: slots < M
//                      are the round, a slot >= M came too late and waits for the next one
//   r<N>/waiting       agents waiting to be admitted while round N runs
//   r<N>/end           why round N ended, written once with compare_set (the first wins),
//                      behind "F " for a failure (a worker failed, an agent went silent)
//                      or "M " for a change of members (a node left, or waits to join)
//   r<N>/admits_at_checkpoints  set by the workers when they end the round themselves at
//                      their next checkpoint to admit waiting agents (train/elastic.h)
//   r<N>/left          members and waiting agents that left after the job finished
//   done               set when the job's workers finished
//   alive/<id>         a heartbeat counter per agent
// A round closes when max_nodes have joined, or when at least min_nodes have and nobody
// joined for last_call_timeout; below min_nodes for join_timeout (from joining) is an error
// naming who is there and who is missing. An agent that leaves an unclosed round (stopped,
// or giving up) ends it, so that it starts over as the next round without a dead member.
// Whoever ends round N (a worker failed, an agent went silent, a waiting agent is to be
// admitted) writes r<N>/end and then moves `round` on to N + 1 with compare_set, so every
// agent sees one reason and one next round. A round ended by a failure counts against the
// --max-restarts of each of its agents: one that has none left leaves the job, and the
// others go on without it while they are min_nodes or more (torchrun's agents count their
// restarts the same way). Every agent polls: waits are short sleeps bounded by the
// timeouts or by the others' heartbeats, so a dead store or a dead peer is an error or a
// new round, never a hang. Once `done` is set, silence is no failure: finished agents
// leave while others may still write their last files.
//
// Heartbeats count, they do not carry times: an agent adds 1 to alive/<id> every
// keep_alive_interval, and a peer whose counter has not moved for heartbeat_timeout (on
// the observer's own clock) is declared gone. Clocks of different machines never meet.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/store/store.h"

namespace weft::parallel {

struct RendezvousOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  // torchrun's defaults.
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(100)};
  // Asked at every poll of next_round(); true makes it throw RendezvousInterrupted (an
  // agent told to stop while it waits for a round).
  std::function<bool()> interrupted;
};

struct RendezvousInterrupted : std::runtime_error {
  RendezvousInterrupted() : std::runtime_error("rendezvous: interrupted") {}
};

// One agent: a unique id, its worker count and the address its workers are reached at.
struct NodeInfo {
  std::string id;
  int nproc = 1;
  std::string host;

  std::string encode() const;
  static NodeInfo decode(const std::string& text);
};

struct RendezvousRound {
  int64_t number = 0;
  int node_rank = 0;              // this agent's slot
  std::vector<NodeInfo> members;  // by node rank

  int num_nodes() const { return static_cast<int>(members.size()); }
  int world_size() const;
  // The global rank of the node's first worker: the workers of earlier nodes come first.
  int first_rank(int node_rank) const;
};

// The keys of one job that agents and workers both touch: a round's end and who waits.
// Workers hold one to end a round at a checkpoint (train/elastic.h).
class ElasticJob {
 public:
  // `store` holds the job's keys at its root (give a PrefixStore("rdzv/<job>", ...)).
  explicit ElasticJob(std::shared_ptr<Store> store);

  // Ends round `number` with `reason` unless it has ended already; a failure counts
  // against each member's restarts. Returns the reason that stands (maybe another's).
  std::string end_round(int64_t number, const std::string& reason, bool failure);
  std::optional<std::string> end_reason(int64_t number);
  // Whether round `number` ended, and by a failure.
  bool ended_by_failure(int64_t number);
  // Agents waiting to join while round `number` runs.
  int64_t waiting(int64_t number);
  // The workers of round `number` end it themselves at a checkpoint to admit waiting
  // agents: the agents' watch leaves that to them.
  void admit_at_checkpoints(int64_t number);

  Store& store() { return *store_; }
  static std::string round_key(int64_t number, const std::string& name);

 protected:
  std::optional<std::string> get_if_set(const std::string& key);
  // The member count round `number` closed with; nullopt while it is open.
  std::optional<int> closed_members(int64_t number);
  std::optional<std::string> end_entry(int64_t number);  // "F reason" or "M reason"
  void advance_round(int64_t from);

  std::shared_ptr<Store> store_;
};

// An agent's side: joining rounds, heartbeats, watching, leaving.
class ElasticRendezvous : public ElasticJob {
 public:
  ElasticRendezvous(std::shared_ptr<Store> store, NodeInfo me, RendezvousOptions options);

  // Joins the next round that admits this agent and waits for it to close. Returns
  // nullopt when the job finished meanwhile (the agent is not needed). Throws when a round
  // it joined stays below min_nodes for join_timeout, naming the nodes that came and how
  // many are missing (the round then starts over without this agent), and
  // RendezvousInterrupted (also withdrawing). Waiting behind a running round has no
  // deadline of its own: it ends with the round, which the members end, or this agent when
  // they all go silent, or with the job.
  std::optional<RendezvousRound> next_round();

  // While `round` runs, called every second or so: sends this agent's heartbeat when due
  // and returns why the round must end, or "" while it goes on. A round ends when someone
  // ended it (its r<N>/end), when a member's heartbeat is older than heartbeat_timeout
  // (then this call ends it, as a failure), or when agents wait to join below max_nodes
  // and the workers do not admit them at checkpoints (then this call ends it at once).
  std::string watch(const RendezvousRound& round);

  // The workers finished: waiting agents stop waiting. Then, leaving: the agent that
  // serves the store waits for the others to leave first (each one leaves, or goes silent).
  void finish_job(int64_t number);
  void leave(int64_t number);
  void wait_for_others_to_leave(const RendezvousRound& round);
  // For an agent that left the job but serves its store: false once the job finished, or
  // nobody is left in it (the current round's members all silent, or no round closing in
  // join_timeout + last_call_timeout). `watched`: the caller's state, -1 at first.
  bool job_alive(int64_t& watched);

  void heartbeat();
  const NodeInfo& me() const { return me_; }
  const RendezvousOptions& options() const { return options_; }

 private:
  void pause();  // one poll interval, or RendezvousInterrupted
  int64_t current_round();
  // Whether the job finished; if so, this agent leaves it (see wait_for_others_to_leave).
  bool job_done();
  std::optional<RendezvousRound> join(int64_t number);
  void withdraw(int64_t number, const std::string& why);
  // The closed round's members; nullopt (and the round ended) when a slot never said who
  // it is. slot -1: this agent is not a member.
  std::optional<RendezvousRound> read_round(int64_t number, int members, int slot);
  // The first member other than this agent whose heartbeat counter has not moved for
  // heartbeat_timeout, as a reason to end the round.
  std::optional<std::string> silent_member(const RendezvousRound& round);
  std::string below_min_message(int64_t number);

  NodeInfo me_;
  RendezvousOptions options_;
  std::chrono::steady_clock::time_point next_heartbeat_{};
  struct Seen {
    int64_t count = -1;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Seen> seen_;  // per member of the round being watched
  int64_t watched_round_ = -1;
  std::optional<RendezvousRound> serving_round_;  // job_alive()'s
  std::chrono::steady_clock::time_point watched_since_{};
};

}  // namespace weft::parallel
