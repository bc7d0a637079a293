// The environment of weft-run's workers: "NAME=value" lists, and the variables each rank
// gets (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT, plus weft's own), for a fixed job and for each round of an elastic one.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace weft::run {

using Environment = std::vector<std::string>;  // "NAME=value"

// This machine's name ("localhost" when it has none).
std::string host_name();

bool has(const Environment& env, const std::string& name);
// Sets (or replaces) `name`.
void set(Environment& env, const std::string& name, const std::string& value);

// Where this node's workers sit in the job.
struct Placement {
  int nproc = 1;         // workers on this node: local ranks 0 .. nproc - 1
  int first_rank = 0;    // the global rank of local rank 0
  int world_size = 1;
  int node_rank = 0;     // GROUP_RANK
  int num_nodes = 1;     // GROUP_WORLD_SIZE
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;  // WEFT_RESTART_COUNT
  std::vector<std::pair<std::string, std::string>> extra;  // more variables for every worker
};

// One environment per local rank: `shared` plus the rank's variables. hostid_prefix
// non-empty: each rank gets NCCL_HOSTID=<prefix><RANK> (more ranks than GPUs).
std::vector<Environment> rank_environments(const Placement& p, const Environment& shared,
                                           const std::string& hostid_prefix);

}  // namespace weft::run
