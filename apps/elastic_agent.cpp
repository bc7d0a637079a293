// weft-run's elastic agent: rendezvous, run the round, end it, again; see elastic_agent.h.
#include "elastic_agent.h"

#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "core/error.h"
#include "parallel/store/tcp_store.h"

namespace weft::run {

namespace {

using parallel::ElasticRendezvous;
using parallel::RendezvousRound;

// How long a client keeps trying to reach the store when it starts.
constexpr std::chrono::seconds kConnectTimeout{60};

// The first agent that can listen on the endpoint serves the store; the others (and
// agents on other machines, where the address is not theirs) connect to it.
// Once connected, one request waits at most half a heartbeat timeout (at least 5 s: a busy
// machine must not pass for a lost store): a store that stops answering must not hold up
// the supervising loop (worker_group.h) for long.
std::shared_ptr<parallel::TCPStore> open_store(const AgentConfig& c) {
  const auto port = static_cast<uint16_t>(c.endpoint_port);
  std::shared_ptr<parallel::TCPStore> store;
  try {
    store = std::make_shared<parallel::TCPStore>(c.endpoint_host, port, /*is_server=*/true, kConnectTimeout);
    say("serving the rendezvous store on " + c.endpoint_host + ":" + std::to_string(port) +
        " (the job needs this weft-run until it ends; weft-run --rdzv-server serves it alone)");
  } catch (const Error&) {
    store = std::make_shared<parallel::TCPStore>(c.endpoint_host, port, /*is_server=*/false, kConnectTimeout);
  }
  store->set_timeout(std::max<std::chrono::milliseconds>(std::chrono::seconds(5),
                                                         c.rendezvous.heartbeat_timeout / 2));
  return store;
}

std::string node_name(const RendezvousRound& round) {
  return "node " + std::to_string(round.node_rank) + " (" + round.members[static_cast<size_t>(round.node_rank)].id +
         ")";
}

class Agent {
 public:
  explicit Agent(const AgentConfig& c)
      : c_(c), store_(open_store(c)),
        rdzv_(std::make_shared<parallel::PrefixStore>("rdzv/" + c.job_id, store_),
              parallel::NodeInfo{host_name() + "-" + std::to_string(getpid()), c.nproc_per_node, host_name()},
              with_interrupt(c.rendezvous)) {}

  int run();

 private:
  static parallel::RendezvousOptions with_interrupt(parallel::RendezvousOptions o) {
    o.interrupted = [] { return stop_signal() != 0; };
    return o;
  }
  RoundResult run_round(const RendezvousRound& round);
  // The job is over for this agent: leave (and, serving the store after a success, let
  // the others leave first). Returns `status`.
  int finish(const RendezvousRound& round, int status);

  const AgentConfig& c_;
  std::shared_ptr<parallel::TCPStore> store_;
  ElasticRendezvous rdzv_;
  int restarts_ = 0;       // rounds this agent was in that ended by a failure
  int failed_status_ = 1;  // the exit status of the last rank of this node that failed
  std::string store_lost_;
};

int Agent::run() {
  say("elastic agent " + rdzv_.me().id + ": job '" + c_.job_id + "' at " + c_.endpoint_host + ":" +
      std::to_string(c_.endpoint_port) + ", " + std::to_string(c_.rendezvous.min_nodes) + " to " +
      std::to_string(c_.rendezvous.max_nodes) + " nodes of " + std::to_string(c_.nproc_per_node) +
      (c_.nproc_per_node == 1 ? " worker" : " workers"));
  // A long-lived --rdzv-server may hold an earlier job of the same name.
  WEFT_CHECK(!rdzv_.store().check({"done"}), "job '", c_.job_id, "' at ", c_.endpoint_host, ":", c_.endpoint_port,
             " has finished already; give this job its own --rdzv-id");
  for (;;) {
    std::optional<RendezvousRound> round;
    try {
      round = rdzv_.next_round();
    } catch (const parallel::RendezvousInterrupted&) {
      say("got a stop signal while waiting for a round: leaving the job");
      return 128 + stop_signal();
    }
    if (!round) {
      say("the job finished without this node");
      return 0;
    }
    std::string members;
    for (const parallel::NodeInfo& n : round->members) members += (members.empty() ? "" : ", ") + n.id;
    const int first = round->first_rank(round->node_rank);
    const std::string name = "round " + std::to_string(round->number);
    say(name + ": " + node_name(*round) + " of " + std::to_string(round->num_nodes()) + " [" + members +
        "], world size " + std::to_string(round->world_size()) + ", ranks " + std::to_string(first) + ".." +
        std::to_string(first + c_.nproc_per_node - 1) + " here");
    failed_status_ = 1;
    const RoundResult r = run_round(*round);
    if (!r.stuck.empty()) say(rank_list(r.stuck) + " still there 10 s after SIGKILL; giving up on waiting for it");
    switch (r.outcome) {
      case RoundResult::Outcome::Succeeded:
        // Workers that end a round to admit a node exit 0 too: the round's end says so.
        if (std::optional<std::string> why = rdzv_.end_reason(round->number)) {
          say(name + " ended: " + *why);
          break;
        }
        rdzv_.finish_job(round->number);
        say("the job finished in " + name);
        return finish(*round, 0);
      case RoundResult::Outcome::Ended:
        say(name + " ended: " + r.error + stopped_clause(r));
        if (!store_lost_.empty()) return 1;
        break;
      case RoundResult::Outcome::Failed: {
        failed_status_ = r.status.signaled ? 1 : r.status.code;
        const std::string reason = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ", " +
                                   node_name(*round) + ") " + r.status.str();
        const std::string stands = rdzv_.end_round(round->number, reason, /*failure=*/true);
        say(reason + stopped_clause(r) + (stands == reason ? "" : "; the round had ended already: " + stands));
        if (stop_signal() != 0) {  // told to stop while stopping the workers: no new round
          say("got " + signal_name(stop_signal()) + ": no new round, exiting with " +
              std::to_string(128 + stop_signal()));
          return finish(*round, 128 + stop_signal());
        }
        break;
      }
      case RoundResult::Outcome::Interrupted:
        rdzv_.end_round(round->number, node_name(*round) + " was stopped (signal " + std::to_string(r.signal) + ")",
                        /*failure=*/false);
        say("exiting with " + std::to_string(128 + r.signal) + stopped_clause(r));
        return finish(*round, 128 + r.signal);
      case RoundResult::Outcome::LaunchFailed:
        rdzv_.end_round(round->number, node_name(*round) + " could not start its workers: " + r.error,
                        /*failure=*/true);
        say(r.error + stopped_clause(r));
        return finish(*round, r.launch_exit_code);
    }
    // The round ended and the job goes on: a failure costs every member one restart.
    if (!rdzv_.ended_by_failure(round->number)) continue;
    if (++restarts_ > c_.max_restarts) {
      say("no restarts left (--max-restarts " + std::to_string(c_.max_restarts) + "): this node leaves the job");
      return finish(*round, failed_status_);
    }
    say("restart " + std::to_string(restarts_) + " of " + std::to_string(c_.max_restarts) + ": joining round " +
        std::to_string(round->number + 1));
  }
}

RoundResult Agent::run_round(const RendezvousRound& round) {
  Placement p;
  p.nproc = c_.nproc_per_node;
  p.first_rank = round.first_rank(round.node_rank);
  p.world_size = round.world_size();
  p.node_rank = round.node_rank;
  p.num_nodes = round.num_nodes();
  p.master_addr = c_.endpoint_host == "0.0.0.0" ? "127.0.0.1" : c_.endpoint_host;
  p.master_port = c_.endpoint_port;
  p.restart_count = restarts_;
  p.extra = {{"WEFT_ELASTIC", "1"},
             {"WEFT_RUN_ID", c_.job_id},
             {"WEFT_ROUND", std::to_string(round.number)},
             {"WEFT_MAX_RESTARTS", std::to_string(c_.max_restarts)},
             {"WEFT_MIN_NODES", std::to_string(c_.rendezvous.min_nodes)},
             {"WEFT_MAX_NODES", std::to_string(c_.rendezvous.max_nodes)},
             {"WEFT_AGENT_STORE_PREFIX",
              "rdzv/" + c_.job_id + "/" + ElasticRendezvous::round_key(round.number, "workers")}};
  GroupOptions options = c_.group;
  options.watch = [this, &round]() -> std::string {
    if (!store_lost_.empty()) return store_lost_;
    try {
      return rdzv_.watch(round);
    } catch (const std::exception& e) {
      store_lost_ = "lost the rendezvous store at " + c_.endpoint_host + ":" + std::to_string(c_.endpoint_port) +
                    " (did the weft-run serving it stop?): " + e.what();
      return store_lost_;
    }
  };
  std::vector<int> ranks;
  for (int local = 0; local < p.nproc; ++local) ranks.push_back(p.first_rank + local);
  Group group(options, ranks, rank_environments(p, c_.shared, c_.hostid_prefix));
  return group.run();
}

int Agent::finish(const RendezvousRound& round, int status) {
  try {
    rdzv_.leave(round.number);
    if (!store_->is_server() || stop_signal() != 0) return status;
    if (status == 0) {
      rdzv_.wait_for_others_to_leave(round);  // they may still be reading the job's end
      return status;
    }
    // Leaving a job that goes on: its store stays until the job ends (or nobody is left).
    say("this weft-run serves the rendezvous store: it keeps serving, without workers, until the job ends");
    for (int64_t watched = -1; stop_signal() == 0 && rdzv_.job_alive(watched);)
      std::this_thread::sleep_for(c_.rendezvous.poll_interval);
  } catch (const std::exception&) {
    // Leaving is best effort: a store already gone has nobody left to wait for.
  }
  return status;
}

}  // namespace

int run_agent(const AgentConfig& config) {
  try {
    Agent agent(config);
    return agent.run();
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}

int serve_rendezvous(const std::string& host, int port) {
  parallel::TCPStore store(host, static_cast<uint16_t>(port), /*is_server=*/true, kConnectTimeout);
  say("serving the rendezvous store on " + host + ":" + std::to_string(store.port()) + " until SIGINT or SIGTERM");
  while (stop_signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  say("stopping the rendezvous store");
  return 0;
}

}  // namespace weft::run
