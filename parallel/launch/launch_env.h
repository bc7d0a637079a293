// LaunchEnv: who this process is in its job, read from the variables its launcher set.
//
// weft-run and torchrun set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT, and so do scripts in the style of PyTorch's DDP tutorials (rank = node rank *
// GPUs per node + local index). Where users outgrow one machine they start jobs with their
// cluster's launcher instead, so without RANK / WORLD_SIZE weft reads what Slurm's srun sets
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE; the master is the
// first host of SLURM_JOB_NODELIST unless MASTER_ADDR is set) and then what Open MPI's
// mpirun sets (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_SIZE; the master is 127.0.0.1 when every rank is on this machine,
// else MASTER_ADDR must be set). MASTER_PORT defaults to 29500 (torchrun's) under Slurm and
// mpirun. A missing or malformed variable is an error that names it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace weft::parallel {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string source;  // "RANK/WORLD_SIZE", "Slurm" or "Open MPI"
  int restart_count = 0;  // WEFT_RESTART_COUNT (weft-run --max-restarts), else 0
  // WEFT_AGENT_STORE_PREFIX (weft-run's elastic agents): the store at MASTER_ADDR:MASTER_PORT
  // is the agents' rendezvous store, served already; the group's keys go under this prefix.
  std::string agent_store_prefix;

  // One line for the log: "rank 1 of 4 (local 1 of 2) from Slurm, master node01:29500".
  std::string describe() const;
};

// Whether this process was started as a rank of a job (any of the three sources is set).
bool launched_as_rank();
// Reads the variables; throws naming what is missing or malformed.
LaunchEnv read_launch_env();
// The first host of a Slurm node list: "node[01-04,07],gpu1" -> "node01".
std::string first_slurm_host(const std::string& nodelist);

// The whole of `text` as an integer in [min, max]; nullopt for anything else (a sign '+',
// spaces, trailing characters, out of range). What every launcher variable and endpoint
// port is read with.
std::optional<int> parse_int_in(std::string_view text, int min, int max);
// "HOST:PORT", split at the last ':', with a non-empty host and a port from 1 to 65535;
// nullopt otherwise.
std::optional<std::pair<std::string, int>> split_host_port(std::string_view text);

// A TCP port on 127.0.0.1 that is free now, for a job of local ranks to rendezvous on (the
// tests', the benchmarks'). Drawn at random below the kernel's ephemeral range
// (ip_local_port_range) rather than found by binding port 0: an ephemeral port may be taken
// as the source port of any outgoing connection on the machine (another job's Gloo mesh)
// before rank 0 listens on it, while a port below the range is taken only by someone asking
// for it by number (tests/support/free_port.py does the same for the scripts).
int free_loopback_port();

}  // namespace weft::parallel
