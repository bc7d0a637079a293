// LaunchEnv: RANK/WORLD_SIZE, then Slurm's, then Open MPI's variables; see launch_env.h.
#include "parallel/launch/launch_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "core/error.h"

namespace weft::parallel {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& text, const char* name, int min, int max) {
  const std::optional<int> value = parse_int_in(text, min, max);
  WEFT_CHECK(value.has_value(), "launch: ", name, "='", text, "' is not an integer in [", min, ", ", max, "]");
  return *value;
}

int int_var(const char* name, int min, int max) {
  auto v = env(name);
  WEFT_CHECK(v.has_value(), "launch: ", name, " is not set");
  return parse_int(*v, name, min, max);
}

int int_var_or(const char* name, int fallback, int min, int max) {
  auto v = env(name);
  return v ? parse_int(*v, name, min, max) : fallback;
}

constexpr int kMaxRanks = 1 << 20;
constexpr int kDefaultMasterPort = 29500;  // torchrun's

}  // namespace

std::string LaunchEnv::describe() const {
  std::ostringstream out;
  out << "rank " << rank << " of " << world_size << " (local " << local_rank << " of " << local_world_size
      << ") from " << source << ", master " << master_addr << ":" << master_port;
  return out.str();
}

bool launched_as_rank() {
  return (env("RANK") && env("WORLD_SIZE")) || (env("SLURM_PROCID") && env("SLURM_NTASKS")) ||
         (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE"));
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry at bracket depth 0; a range inside brackets gives its first value.
  std::string entry;
  int depth = 0;
  for (char c : nodelist) {
    if (c == ',' && depth == 0) break;
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    entry += c;
  }
  const size_t open = entry.find('[');
  if (open == std::string::npos) return entry;
  const size_t close = entry.find(']', open);
  WEFT_CHECK(close != std::string::npos, "launch: SLURM_JOB_NODELIST '", nodelist, "' has an unclosed '['");
  const std::string inside = entry.substr(open + 1, close - open - 1);
  const std::string first = inside.substr(0, inside.find_first_of(",-"));
  return entry.substr(0, open) + first + entry.substr(close + 1);
}

LaunchEnv read_launch_env() {
  LaunchEnv e;
  std::optional<std::string> default_master;
  if (env("RANK") && env("WORLD_SIZE")) {
    e.source = "RANK/WORLD_SIZE";
    e.world_size = int_var("WORLD_SIZE", 1, kMaxRanks);
    e.rank = int_var("RANK", 0, e.world_size - 1);
    e.local_rank = int_var_or("LOCAL_RANK", e.rank, 0, kMaxRanks);
    e.local_world_size = int_var_or("LOCAL_WORLD_SIZE", e.world_size, 1, kMaxRanks);
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    e.source = "Slurm";
    e.world_size = int_var("SLURM_NTASKS", 1, kMaxRanks);
    e.rank = int_var("SLURM_PROCID", 0, e.world_size - 1);
    e.local_rank = int_var_or("SLURM_LOCALID", 0, 0, kMaxRanks);
    // SLURM_NTASKS_PER_NODE is a plain number when every node runs as many tasks.
    auto per_node = env("SLURM_NTASKS_PER_NODE");
    e.local_world_size = per_node && per_node->find_first_not_of("0123456789") == std::string::npos
                             ? parse_int(*per_node, "SLURM_NTASKS_PER_NODE", 1, kMaxRanks)
                             : e.world_size;
    auto nodelist = env("SLURM_JOB_NODELIST") ? env("SLURM_JOB_NODELIST") : env("SLURM_NODELIST");
    if (nodelist) default_master = first_slurm_host(*nodelist);
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    e.source = "Open MPI";
    e.world_size = int_var("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks);
    e.rank = int_var("OMPI_COMM_WORLD_RANK", 0, e.world_size - 1);
    e.local_rank = int_var_or("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, kMaxRanks);
    e.local_world_size = int_var_or("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size, 1, kMaxRanks);
    if (e.local_world_size == e.world_size) default_master = "127.0.0.1";  // every rank on this machine
  } else {
    WEFT_FAIL("launch: this process was not started as a rank of a job: none of RANK and WORLD_SIZE (weft-run, "
              "torchrun), SLURM_PROCID and SLURM_NTASKS (srun), OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE "
              "(mpirun) is set");
  }
  WEFT_CHECK(e.local_rank < e.local_world_size, "launch: local rank ", e.local_rank, " is not below the local world size ",
             e.local_world_size);
  if (auto addr = env("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else {
    WEFT_CHECK(default_master.has_value(), "launch: MASTER_ADDR is not set (the host where rank 0 serves the "
               "rendezvous; ", e.source == "Open MPI" ? "mpirun across machines needs it" : "weft-run and torchrun set it",
               ")");
    e.master_addr = *default_master;
  }
  if (e.source == "RANK/WORLD_SIZE") e.master_port = int_var("MASTER_PORT", 1, 65535);
  else e.master_port = int_var_or("MASTER_PORT", kDefaultMasterPort, 1, 65535);
  e.restart_count = int_var_or("WEFT_RESTART_COUNT", 0, 0, kMaxRanks);
  e.agent_store_prefix = env("WEFT_AGENT_STORE_PREFIX").value_or("");
  return e;
}

std::optional<int> parse_int_in(std::string_view text, int min, int max) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) return std::nullopt;
  return value;
}

std::optional<std::pair<std::string, int>> split_host_port(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::optional<int> port = parse_int_in(text.substr(colon + 1), 1, 65535);
  if (!port) return std::nullopt;
  return std::make_pair(std::string(text.substr(0, colon)), *port);
}

int free_loopback_port() {
  int low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); !(range >> low)) low = 32768;
  std::mt19937 draw(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = low > 10001 ? std::uniform_int_distribution<int>(10000, low - 1)(draw) : 0;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof addr;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    if (ok) return ntohs(addr.sin_port);
  }
  WEFT_FAIL("free_loopback_port: no free TCP port on 127.0.0.1");
}

}  // namespace weft::parallel
