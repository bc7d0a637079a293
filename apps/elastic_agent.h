// weft-run's elastic mode (torchrun's agent): weft-run --nnodes MIN:MAX --rdzv-endpoint
// HOST:PORT --rdzv-id JOB. Each node's weft-run is an agent. Round after round it meets the
// other agents at the rendezvous (parallel/launch/elastic_rendezvous.h), starts its workers with
// their place in that round, and watches them and the rendezvous: a worker failing, a peer
// going silent or a node waiting to join ends the round, every agent stops its workers and
// the next round begins with whoever is there, until the workers finish or the job has
// failed more than --max-restarts times.
//
// The store: the first agent able to listen on the endpoint serves it (in a thread of its
// own weft-run), the others connect; `weft-run --rdzv-server` serves it alone, so that the
// job outlives any one node. Workers use the same store for their process group (under
// rdzv/<job>/r<N>/workers), so a round needs no port of its own.
//
// Each worker gets torchrun's variables, with the round's ranks, and weft's:
//   WEFT_ELASTIC=1, WEFT_RUN_ID (the --rdzv-id), WEFT_ROUND (N), WEFT_RESTART_COUNT
//   (rounds ended by a failure so far), WEFT_MAX_RESTARTS, WEFT_MIN_NODES, WEFT_MAX_NODES,
//   GROUP_WORLD_SIZE (nodes this round), WEFT_AGENT_STORE_PREFIX (init_process_group's
//   env:// then connects to MASTER_ADDR:MASTER_PORT, the rendezvous endpoint, as a client).
#pragma once

#include <string>

#include "parallel/launch/elastic_rendezvous.h"
#include "worker_env.h"
#include "worker_group.h"

namespace weft::run {

struct AgentConfig {
  std::string endpoint_host;
  int endpoint_port = 0;
  std::string job_id;
  parallel::RendezvousOptions rendezvous;
  int nproc_per_node = 1;
  int max_restarts = 0;
  GroupOptions group;  // the program, the prefix and the grace period
  Environment shared;  // what every worker inherits
  std::string hostid_prefix;
};

// Both after install_signal_handlers() (worker_group.h).
// Runs this node's agent until the job ends; returns weft-run's exit status (0: the job
// finished; the failed rank's status when its failure used up the restarts, else 1; 128+N
// after signal N).
int run_agent(const AgentConfig& config);

// weft-run --rdzv-server: serves the rendezvous store on host:port until SIGINT or SIGTERM.
int serve_rendezvous(const std::string& host, int port);

}  // namespace weft::run
