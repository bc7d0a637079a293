// weft-run: weft's process launcher, after torchrun. Starts N worker processes of PROGRAM
// with the environment torchrun gives its workers (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, ...), prefixes their output with their rank, and supervises them: one
// failing stops the others, and the whole group is restarted up to --max-restarts times.
// With --rdzv-endpoint it is one agent of an elastic job (elastic_agent.h).
//
//   weft-run --nproc-per-node 4 build/apps/weft-train --mode ddp ...
//   weft-run --nproc-per-node 8 --nnodes 2 --node-rank 1 --master-addr node0 PROGRAM ARGS...
//   weft-run --nnodes 1:4 --nproc-per-node 2 --rdzv-endpoint node0:29400 --rdzv-id job7 PROGRAM ARGS...
//   weft-run --rdzv-server --rdzv-endpoint 0.0.0.0:29400
//
// Exit status: 0 when every rank exits 0; the failed rank's exit status (1-255), or 1
// when it was killed by a signal; 128 + N after signal N (SIGINT: 130); 127 when PROGRAM
// cannot be executed; 2 for bad arguments.
//
// This file is the command line and the shared environment; worker_env.h is each rank's
// variables, worker_group.h the processes, elastic_agent.h the elastic rounds.
#include <CLI/CLI.hpp>

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "elastic_agent.h"
#include "parallel/launch/launch_env.h"
#include "worker_env.h"
#include "worker_group.h"

extern char** environ;

namespace {

using namespace weft::run;

struct Config {
  int nproc_per_node = 0, nnodes = 1, node_rank = 0, master_port = 29500, max_restarts = 0;
  std::string master_addr = "127.0.0.1";
  double grace_period = 5.0;
  bool no_prefix = false;
  std::vector<std::string> command;  // PROGRAM and its arguments
  // Elastic mode (--rdzv-endpoint): --nnodes MIN:MAX, the rendezvous and its settings.
  std::string nnodes_text = "1", rdzv_endpoint, rdzv_id = "default", rdzv_conf, rdzv_backend = "c10d";
  std::string rdzv_host;
  int rdzv_port = 0;
  weft::parallel::RendezvousOptions rendezvous;
  bool rdzv_server = false;
};

// "N" or "MIN:MAX" into the rendezvous options; nnodes is N (fixed), or MAX (elastic).
std::optional<std::string> parse_nnodes(Config& c) {
  const std::string& t = c.nnodes_text;
  auto number = [](const std::string& text, int& out) {
    const std::optional<int> value = weft::parallel::parse_int_in(text, 1, std::numeric_limits<int>::max());
    if (value) out = *value;
    return value.has_value();
  };
  const size_t colon = t.find(':');
  int lo = 0, hi = 0;
  if (colon == std::string::npos ? !number(t, lo) : !number(t.substr(0, colon), lo) || !number(t.substr(colon + 1), hi))
    return "--nnodes '" + t + "' is neither a node count N nor a range MIN:MAX of positive integers";
  if (colon == std::string::npos) hi = lo;
  if (lo > hi) return "--nnodes " + t + ": MIN is above MAX";
  c.rendezvous.min_nodes = lo;
  c.rendezvous.max_nodes = hi;
  c.nnodes = hi;
  return std::nullopt;
}

// --rdzv-conf join_timeout=600,last_call_timeout=30,keep_alive_interval=5,heartbeat_timeout=30 (seconds).
std::optional<std::string> parse_rdzv_conf(Config& c) {
  std::istringstream in(c.rdzv_conf);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(v > 0) || v > 1e6)
      return "--rdzv-conf " + item + ": expected KEY=SECONDS with a positive number of seconds";
    const std::chrono::milliseconds ms{static_cast<int64_t>(v * 1000 + 0.5)};
    if (key == "join_timeout") c.rendezvous.join_timeout = ms;
    else if (key == "last_call_timeout") c.rendezvous.last_call_timeout = ms;
    else if (key == "keep_alive_interval") c.rendezvous.keep_alive_interval = ms;
    else if (key == "heartbeat_timeout") c.rendezvous.heartbeat_timeout = ms;
    else
      return "--rdzv-conf: unknown key '" + key +
             "' (join_timeout, last_call_timeout, keep_alive_interval, heartbeat_timeout)";
  }
  // An agent looks at its peers about once a second (GroupOptions::watch_every).
  const auto& r = c.rendezvous;
  auto text = [](std::chrono::milliseconds ms) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%g s", static_cast<double>(ms.count()) / 1000.0);
    return std::string(buffer);
  };
  if (r.heartbeat_timeout <= r.keep_alive_interval + std::chrono::seconds(1))
    return "--rdzv-conf: heartbeat_timeout (" + text(r.heartbeat_timeout) + ") must be longer than "
           "keep_alive_interval (" + text(r.keep_alive_interval) + ") plus 1 s, or every agent would look silent to "
           "the others";
  return std::nullopt;
}

// "HOST:PORT" into rdzv_host and rdzv_port.
std::optional<std::string> parse_endpoint(Config& c) {
  const auto endpoint = weft::parallel::split_host_port(c.rdzv_endpoint);
  if (!endpoint) return "--rdzv-endpoint '" + c.rdzv_endpoint + "' is not HOST:PORT with a port from 1 to 65535";
  std::tie(c.rdzv_host, c.rdzv_port) = *endpoint;
  return std::nullopt;
}

// Parses the command line into `c`; returns an exit code when weft-run must stop here
// (0 after --help, 2 for bad arguments, with the message printed).
std::optional<int> parse(int argc, char** argv, Config& c) {
  CLI::App app{
      "weft-run: start N worker processes of PROGRAM with torchrun's environment (RANK, WORLD_SIZE,\n"
      "LOCAL_RANK, ...) and supervise them. Everything after PROGRAM is passed to it unchanged."};
  app.name("weft-run");
  app.prefix_command();  // the first positional argument is PROGRAM: parsing stops there
  constexpr int kMaxRanks = 1 << 20;
  app.add_option("--nproc-per-node,--nproc_per_node", c.nproc_per_node, "worker processes on this node (required)")
      ->check(CLI::Range(1, kMaxRanks));
  app.add_option("--nnodes", c.nnodes_text,
                 "nodes in the job (1), or MIN:MAX for an elastic job (with --rdzv-endpoint)");
  app.add_option("--node-rank,--node_rank", c.node_rank, "this node's rank, 0 .. nnodes-1 (0)")
      ->check(CLI::Range(0, kMaxRanks));
  app.add_option("--master-addr,--master_addr", c.master_addr, "address of rank 0's node (127.0.0.1)");
  app.add_option("--master-port,--master_port", c.master_port, "port for the rendezvous at rank 0 (29500)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--max-restarts,--max_restarts", c.max_restarts,
                 "restart the whole group this many times after a failure (0)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--grace-period", c.grace_period, "seconds between SIGTERM and SIGKILL when stopping workers (5)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("--no-prefix", c.no_prefix, "pass the workers' output through without the \"[rank R] \" prefix");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", c.rdzv_endpoint,
                 "elastic mode: HOST:PORT of the rendezvous store (served by the first agent there, or by "
                 "weft-run --rdzv-server)");
  app.add_option("--rdzv-id,--rdzv_id", c.rdzv_id, "elastic mode: the job's id, the same on every node (default)");
  app.add_option("--rdzv-conf,--rdzv_conf", c.rdzv_conf,
                 "elastic mode: KEY=SECONDS,... for join_timeout (600), last_call_timeout (30), "
                 "keep_alive_interval (5), heartbeat_timeout (30)");
  app.add_option("--rdzv-backend,--rdzv_backend", c.rdzv_backend, "c10d (the one there is: weft's TCP store)")
      ->check(CLI::IsMember({"c10d"}));
  app.add_flag("--rdzv-server", c.rdzv_server, "serve the rendezvous store at --rdzv-endpoint until stopped");
  app.footer(
      "PROGRAM and its arguments follow the options: weft-run [OPTIONS] [--] PROGRAM [ARGS...]\n"
      "Exit status: 0 when every rank exits 0; the failed rank's status (1-255), or 1 when it was killed\n"
      "by a signal; 128+N after signal N (SIGINT: 130); 127 when PROGRAM cannot be executed; 2 for bad\n"
      "arguments.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  c.command = app.remaining();
  auto bad = [](const std::string& message) {
    say(message + " (see weft-run --help)");
    return 2;
  };
  // Unknown options before PROGRAM end up in front of it (and stop the parsing there, so
  // they are looked at before anything else); a "--" before PROGRAM stays too.
  if (!c.command.empty() && c.command[0] == "--")
    c.command.erase(c.command.begin());
  else if (!c.command.empty() && c.command[0].size() > 1 && c.command[0][0] == '-')
    return bad("unknown option " + c.command[0]);
  if (auto error = parse_nnodes(c)) return bad(*error);
  if (auto error = parse_rdzv_conf(c)) return bad(*error);
  if (!c.rdzv_endpoint.empty())
    if (auto error = parse_endpoint(c)) return bad(*error);
  if (c.rdzv_server) {
    if (c.rdzv_endpoint.empty()) return bad("--rdzv-server needs --rdzv-endpoint HOST:PORT to serve on");
    if (!c.command.empty()) return bad("--rdzv-server runs no PROGRAM ('" + c.command[0] + "' given)");
    return std::nullopt;
  }
  if (c.rdzv_endpoint.empty() && c.rendezvous.min_nodes != c.rendezvous.max_nodes)
    return bad("--nnodes " + c.nnodes_text + " is an elastic range: it needs --rdzv-endpoint HOST:PORT");
  if (!c.rdzv_endpoint.empty())
    for (const char* fixed : {"--node-rank", "--master-addr", "--master-port"})
      if (app.count(fixed) > 0)
        return bad(std::string(fixed) + " is for a fixed job; with --rdzv-endpoint the rendezvous assigns node ranks "
                   "and the workers meet at the endpoint");
  if (c.rdzv_id.empty() || c.rdzv_id.find_first_of(" /") != std::string::npos)
    return bad("--rdzv-id '" + c.rdzv_id + "' must be a non-empty word without '/'");
  if (c.nproc_per_node == 0) return bad("--nproc-per-node is required");
  if (c.command.empty()) return bad("no PROGRAM to run");
  if (c.node_rank >= c.nnodes)
    return bad("--node-rank " + std::to_string(c.node_rank) + " is out of range for --nnodes " +
               std::to_string(c.nnodes) + " (0.." + std::to_string(c.nnodes - 1) + ")");
  if (static_cast<int64_t>(c.nnodes) * c.nproc_per_node > kMaxRanks)
    return bad("--nnodes " + std::to_string(c.nnodes) + " times --nproc-per-node " + std::to_string(c.nproc_per_node) +
               " is more ranks than weft-run starts (" + std::to_string(kMaxRanks) + ")");
  return std::nullopt;
}

int usable_cores() {
  cpu_set_t cores;
  if (sched_getaffinity(0, sizeof cores, &cores) == 0) return CPU_COUNT(&cores);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

// What every worker shares: weft-run's own environment, plus OMP_NUM_THREADS and NCCL's
// loopback settings where they apply and the user has not set them. Says once what it
// set. Returns the NCCL_HOSTID prefix ("HOST-rank") when each rank needs its own.
std::string shared_environment(const Config& c, std::vector<std::string>& env) {
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  const int n = c.nproc_per_node;
  if (!has(env, "OMP_NUM_THREADS")) {
    // torchrun sets 1; weft's CPU kernels are multi-threaded, so the ranks share the cores.
    const int cores = usable_cores();
    const int threads = std::max(1, cores / n);
    set(env, "OMP_NUM_THREADS", std::to_string(threads));
    say("OMP_NUM_THREADS is not set: " +
        (n == 1 ? std::string("the worker gets") : "each of the " + std::to_string(n) + " workers gets") +
        " OMP_NUM_THREADS=" + std::to_string(threads) + " (" + std::to_string(cores) + " cores / " + std::to_string(n) +
        ")");
  }
  // More ranks than GPUs: NCCL 2.28 refuses two ranks on one GPU unless each has its own
  // NCCL_HOSTID, and then it needs its socket transport (docs/design.md, pitfalls). Physical
  // GPUs count here: WEFT_VIRTUAL_DEVICES puts several logical devices on one.
  int devices = 0;
  try {
    devices = weft::cuda_physical_device_count();
  } catch (const std::exception&) {
  }
  if (devices <= 0 || n <= devices) return "";
  std::string hostid_prefix = has(env, "NCCL_HOSTID") ? "" : host_name() + "-rank";
  std::vector<std::string> done, kept;
  if (hostid_prefix.empty())
    kept.emplace_back("NCCL_HOSTID");
  else
    done.push_back("NCCL_HOSTID=" + hostid_prefix + "<RANK>");
  for (auto [name, value] : {std::pair{"NCCL_SOCKET_IFNAME", "lo"}, std::pair{"NCCL_NET", "Socket"},
                             std::pair{"NCCL_P2P_DISABLE", "1"}, std::pair{"NCCL_SHM_DISABLE", "1"}}) {
    if (has(env, name)) {
      kept.emplace_back(name);
    } else {
      set(env, name, value);
      done.push_back(std::string(name) + "=" + value);
    }
  }
  std::string message = std::to_string(n) + " ranks on this node share " + std::to_string(devices) + " GPU" +
                        (devices == 1 ? "" : "s") + ": NCCL over sockets on loopback";
  for (size_t i = 0; i < done.size(); ++i) message += (i ? ", " : "; set ") + done[i];
  for (size_t i = 0; i < kept.size(); ++i) message += (i ? ", " : "; kept the user's ") + kept[i];
  say(message);
  return hostid_prefix;
}

int run(const Config& c) {
  install_signal_handlers();
  std::vector<std::string> shared;
  const std::string hostid_prefix = shared_environment(c, shared);
  GroupOptions options{c.command, !c.no_prefix, std::chrono::duration<double>(c.grace_period)};
  if (!c.rdzv_endpoint.empty())
    return run_agent({.endpoint_host = c.rdzv_host, .endpoint_port = c.rdzv_port, .job_id = c.rdzv_id,
                      .rendezvous = c.rendezvous, .nproc_per_node = c.nproc_per_node,
                      .max_restarts = c.max_restarts, .group = options, .shared = shared,
                      .hostid_prefix = hostid_prefix});
  Placement placement{.nproc = c.nproc_per_node, .first_rank = c.node_rank * c.nproc_per_node,
                      .world_size = c.nnodes * c.nproc_per_node, .node_rank = c.node_rank, .num_nodes = c.nnodes,
                      .master_addr = c.master_addr, .master_port = c.master_port};
  std::vector<int> ranks;
  for (int local = 0; local < c.nproc_per_node; ++local) ranks.push_back(placement.first_rank + local);

  for (int restart = 0;; ++restart) {
    RoundResult r;
    {
      placement.restart_count = restart;
      Group group(options, ranks, rank_environments(placement, shared, hostid_prefix));
      r = group.run();
    }
    if (!r.stuck.empty()) say(rank_list(r.stuck) + " still there 10 s after SIGKILL; giving up on waiting for it");
    switch (r.outcome) {
      case RoundResult::Outcome::Succeeded:
        return 0;
      case RoundResult::Outcome::Interrupted:
        say("exiting with " + std::to_string(128 + r.signal) + stopped_clause(r));
        return 128 + r.signal;
      case RoundResult::Outcome::LaunchFailed:
        say(r.error + stopped_clause(r));
        return r.launch_exit_code;
      case RoundResult::Outcome::Failed:
      case RoundResult::Outcome::Ended:  // only with a watch: elastic mode
        break;
    }
    std::string message = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") " + r.status.str() +
                          (r.stopped.empty() ? "; no other rank was running" : stopped_clause(r));
    if (stop_signal() != 0) {  // told to stop while stopping the others: no restart
      say(message + "; got " + signal_name(stop_signal()) + ": no restart, exiting with " +
          std::to_string(128 + stop_signal()));
      return 128 + stop_signal();
    }
    if (restart < c.max_restarts) {
      say(message + "; restarting the group (restart " + std::to_string(restart + 1) + " of " +
          std::to_string(c.max_restarts) + ")");
      continue;
    }
    if (c.max_restarts > 0) message += "; no restarts left (--max-restarts " + std::to_string(c.max_restarts) + ")";
    say(message);
    return r.status.signaled ? 1 : r.status.code;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (std::optional<int> code = parse(argc, argv, c)) return *code;
  try {
    if (c.rdzv_server) {
      install_signal_handlers();
      return serve_rendezvous(c.rdzv_host, c.rdzv_port);
    }
    return run(c);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
