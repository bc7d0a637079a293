// init_process_group and the default group; see distributed.h.
#include "parallel/process_group/distributed.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "parallel/process_group/debug_process_group.h"
#include "parallel/process_group/process_group_gloo.h"
#include "parallel/process_group/process_group_nccl.h"
#include "parallel/process_group/ring_allreduce.h"
#include "parallel/store/file_store.h"
#include "parallel/store/tcp_store.h"

namespace weft::parallel {

namespace {

struct DefaultGroup {
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{0};
  std::string bind_host;
  int next_group_id = 0;
  std::string backend;  // as init_process_group was given it: what sub-groups use by default
};

std::mutex state_mutex;
std::unique_ptr<DefaultGroup> state;

DefaultGroup& current(const char* who) {
  WEFT_CHECK(state != nullptr, who, ": no process group: call init_process_group first");
  return *state;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Where this rank's Gloo pairs listen: loopback when the job is on loopback, else
// WEFT_GLOO_HOST, else this machine's name.
std::string bind_host_for(const std::string& master_addr) {
  if (const char* host = std::getenv("WEFT_GLOO_HOST"); host != nullptr && *host != '\0') return host;
  if (is_loopback(master_addr)) return "127.0.0.1";
  char name[256] = {};
  WEFT_CHECK(::gethostname(name, sizeof name - 1) == 0, "init_process_group: cannot read this machine's host name");
  return name;
}

// Every rank announces itself, then waits for all; a rank missing at the timeout is named.
void rendezvous(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  store.set("arrived/rank_" + std::to_string(rank), std::string("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("arrived/rank_" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const Error&) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[r]})) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        ++count;
      }
    // Rank 0 usually serves the store: it stays a moment, so that the other ranks that
    // timed out with it can still ask which ranks are missing before it exits.
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    WEFT_FAIL("init_process_group: rank ", rank, " of ", size, " waited ", timeout.count(), " ms for the others; ",
              count == 1 ? "rank " : "ranks ", missing, count == 1 ? " has" : " have", " not arrived");
  }
}

std::pair<std::string, int> parse_host_port(const std::string& text, const std::string& method) {
  const std::optional<std::pair<std::string, int>> endpoint = split_host_port(text);
  WEFT_CHECK(endpoint.has_value(), "init_process_group: init_method '", method,
             "' should be tcp://HOST:PORT with a port from 1 to 65535");
  return *endpoint;
}

}  // namespace

std::shared_ptr<ProcessGroup> new_group_from_store(const std::string& backend, std::shared_ptr<Store> store, int rank,
                                                   int size, std::chrono::milliseconds timeout,
                                                   const std::string& bind_host) {
  WEFT_CHECK(size >= 1 && rank >= 0 && rank < size, "process group: rank ", rank, " is not in [0, ", size, ")");
  rendezvous(*store, rank, size, timeout);
  std::shared_ptr<ProcessGroup> group;
  if (backend == "gloo") {
    group = new_gloo_group(std::make_shared<PrefixStore>("gloo", store), rank, size, timeout, bind_host);
  } else if (backend == "nccl") {
    group = new_nccl_group(std::make_shared<PrefixStore>("nccl", store), rank, size, timeout);
  } else {
    WEFT_FAIL("process group: unknown backend '", backend, "' (expected gloo or nccl)");
  }
  if (const char* algorithm = std::getenv("WEFT_ALL_REDUCE"); algorithm != nullptr && *algorithm != '\0') {
    WEFT_CHECK(std::string(algorithm) == "ring", "WEFT_ALL_REDUCE='", algorithm,
               "': the one all-reduce algorithm to choose is ring (unset: the backend's own)");
    group = with_ring_all_reduce(group);
  }
  if (distributed_debug_enabled()) group = debug_process_group(group, std::make_shared<PrefixStore>("debug", store));
  return group;
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const InitOptions& options) {
  std::lock_guard lock(state_mutex);
  WEFT_CHECK(state == nullptr, "init_process_group: already initialised (call destroy_process_group first)");
  const std::string& method = options.init_method;
  int rank = options.rank, size = options.world_size;
  std::string master_addr = "127.0.0.1";
  std::shared_ptr<Store> store;
  std::string origin;
  if (method == "env://") {
    const LaunchEnv env = read_launch_env();
    if (rank < 0) rank = env.rank;
    if (size < 0) size = env.world_size;
    master_addr = env.master_addr;
    origin = env.source;
    WEFT_CHECK(rank >= 0 && rank < size, "init_process_group: rank ", rank, " is not in [0, ", size, ")");
    // Under an elastic agent the store is served already (by an agent): every rank connects.
    const bool agent_store = !env.agent_store_prefix.empty();
    store = std::make_shared<TCPStore>(env.master_addr, static_cast<uint16_t>(env.master_port),
                                       rank == 0 && !agent_store, options.timeout);
    if (agent_store) store = std::make_shared<PrefixStore>(env.agent_store_prefix, store);
  } else if (method.rfind("tcp://", 0) == 0 || method.rfind("file://", 0) == 0) {
    if ((rank < 0 || size < 0) && launched_as_rank()) {
      const LaunchEnv env = read_launch_env();
      if (rank < 0) rank = env.rank;
      if (size < 0) size = env.world_size;
      origin = env.source;
    }
    WEFT_CHECK(rank >= 0 && size >= 1 && rank < size, "init_process_group: ", method,
               " needs the rank and the world size (InitOptions::rank, ::world_size, or RANK and WORLD_SIZE); got rank ",
               rank, " of ", size);
    if (method[0] == 't') {
      auto [host, port] = parse_host_port(method.substr(6), method);
      master_addr = host;
      store = std::make_shared<TCPStore>(host, static_cast<uint16_t>(port), rank == 0, options.timeout);
    } else {
      store = std::make_shared<FileStore>(method.substr(7), options.timeout);
    }
    if (origin.empty()) origin = "InitOptions";
  } else {
    WEFT_FAIL("init_process_group: unknown init_method '", method, "' (expected env://, tcp://HOST:PORT or file://PATH)");
  }
  const std::string bind_host = bind_host_for(master_addr);
  auto group = new_group_from_store(backend, std::make_shared<PrefixStore>("default", store), rank, size,
                                    options.timeout, bind_host);
  if (rank == 0 || std::getenv("WEFT_DISTRIBUTED_VERBOSE"))
    std::cerr << "weft: rank " << rank << " of " << size << " joined the default " << group->backend_name()
              << " group (" << method << ", rank and size from " << origin << ")\n";
  state = std::make_unique<DefaultGroup>(DefaultGroup{group, store, options.timeout, bind_host, 0, backend});
  return group;
}

void destroy_process_group() {
  std::lock_guard lock(state_mutex);
  if (state == nullptr) return;
  // Rank 0 serves the store: it stays until every rank has left (bounded), so that a rank
  // still finishing with the store does not lose it.
  try {
    const int size = state->group->size();
    const bool serving = state->group->rank() == 0;
    state->store->add("left", 1);
    const auto until = std::chrono::steady_clock::now() + std::min(state->timeout, std::chrono::milliseconds(10000));
    while (serving && state->store->add("left", 0) < size && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } catch (const std::exception&) {
    // Leaving is best effort: a store already gone has nobody left to wait for.
  }
  state.reset();
}

bool is_initialized() {
  std::lock_guard lock(state_mutex);
  return state != nullptr;
}

ProcessGroup& default_group() {
  std::lock_guard lock(state_mutex);
  return *current("default_group").group;
}

std::shared_ptr<ProcessGroup> default_group_ptr() {
  std::lock_guard lock(state_mutex);
  return current("default_group_ptr").group;
}

int get_rank() { return default_group().rank(); }
int get_world_size() { return default_group().size(); }

std::shared_ptr<Store> default_store() {
  std::lock_guard lock(state_mutex);
  return current("default_store").store;
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& backend_or_default) {
  std::shared_ptr<Store> store;
  int me = 0, world = 0, id = 0;
  std::chrono::milliseconds timeout{0};
  std::string bind_host, backend = backend_or_default;
  {
    std::lock_guard lock(state_mutex);
    DefaultGroup& d = current("new_group");
    if (backend.empty()) backend = d.backend;
    store = d.store;
    me = d.group->rank();
    world = d.group->size();
    timeout = d.timeout;
    bind_host = d.bind_host;
    id = d.next_group_id++;
  }
  WEFT_CHECK(!ranks.empty(), "new_group: no ranks given");
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    WEFT_CHECK(ranks[i] >= 0 && ranks[i] < world, "new_group: rank ", ranks[i], " is not in the default group (0 .. ",
               world - 1, ")");
    for (size_t j = 0; j < i; ++j) WEFT_CHECK(ranks[j] != ranks[i], "new_group: rank ", ranks[i], " is given twice");
    if (ranks[i] == me) index = static_cast<int>(i);
  }
  if (index < 0) return nullptr;
  return new_group_from_store(backend, std::make_shared<PrefixStore>("group_" + std::to_string(id), store), index,
                              static_cast<int>(ranks.size()), timeout, bind_host);
}

std::shared_ptr<ProcessGroup> new_subgroups(int group_size, const std::string& backend) {
  const int world = get_world_size();
  if (group_size == 0) {
    WEFT_CHECK(launched_as_rank(), "new_subgroups: without a group size it makes one group per machine, of ",
               "LOCAL_WORLD_SIZE ranks, but this process was not started by a launcher: give the group size");
    group_size = read_launch_env().local_world_size;
  }
  WEFT_CHECK(group_size >= 1 && group_size <= world && world % group_size == 0, "new_subgroups: a group size of ",
             group_size, " does not divide the default group's ", world, " ranks into equal groups");
  std::shared_ptr<ProcessGroup> mine;
  for (int first = 0; first < world; first += group_size) {
    std::vector<int> ranks(static_cast<size_t>(group_size));
    for (int i = 0; i < group_size; ++i) ranks[static_cast<size_t>(i)] = first + i;
    if (auto group = new_group(ranks, backend)) mine = group;
  }
  return mine;
}

}  // namespace weft::parallel
