// The variables of weft-run's workers; see worker_env.h.
#include "worker_env.h"

#include <unistd.h>

namespace weft::run {

namespace {

bool names(const std::string& entry, const std::string& name) {
  return entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=';
}

}  // namespace

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool has(const Environment& env, const std::string& name) {
  for (const std::string& e : env)
    if (names(e, name)) return true;
  return false;
}

void set(Environment& env, const std::string& name, const std::string& value) {
  for (std::string& e : env)
    if (names(e, name)) {
      e = name + "=" + value;
      return;
    }
  env.push_back(name + "=" + value);
}

std::vector<Environment> rank_environments(const Placement& p, const Environment& shared,
                                           const std::string& hostid_prefix) {
  std::vector<Environment> envs(static_cast<size_t>(p.nproc), shared);
  for (int local = 0; local < p.nproc; ++local) {
    Environment& env = envs[static_cast<size_t>(local)];
    const int rank = p.first_rank + local;
    set(env, "RANK", std::to_string(rank));
    set(env, "WORLD_SIZE", std::to_string(p.world_size));
    set(env, "LOCAL_RANK", std::to_string(local));
    set(env, "LOCAL_WORLD_SIZE", std::to_string(p.nproc));
    set(env, "GROUP_RANK", std::to_string(p.node_rank));
    set(env, "GROUP_WORLD_SIZE", std::to_string(p.num_nodes));
    set(env, "MASTER_ADDR", p.master_addr);
    set(env, "MASTER_PORT", std::to_string(p.master_port));
    set(env, "WEFT_RESTART_COUNT", std::to_string(p.restart_count));
    for (const auto& [name, value] : p.extra) set(env, name, value);
    if (!hostid_prefix.empty()) set(env, "NCCL_HOSTID", hostid_prefix + std::to_string(rank));
  }
  return envs;
}

}  // namespace weft::run
