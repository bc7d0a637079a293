// Starts the ranks of a test job as local processes over loopback and collects what they
// did: every rank's exit status and output. Every wait is bounded: ranks still running at
// the deadline are killed (SIGKILL, by pid) and reported as timed out, and every child is
// reaped, so a test never leaves a process behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/launch/launch_env.h"

extern char** environ;

namespace weft::test {

// A free port on 127.0.0.1 for a job's rendezvous (parallel/launch/launch_env.h says how it is drawn).
inline int free_port() { return parallel::free_loopback_port(); }

struct RankOutcome {
  int exit_status = -1;  // the process's exit status, or -1 when it was killed at the deadline
  std::string output;    // stdout and stderr, interleaved
};

// Runs `argv` once per entry of `envs` (each a set of extra variables for that process),
// all at once; waits up to `deadline` for all of them.
inline std::vector<RankOutcome> run_processes(const std::vector<std::string>& argv,
                                              const std::vector<std::map<std::string, std::string>>& envs,
                                              std::chrono::seconds deadline) {
  const auto dir = std::filesystem::temp_directory_path();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (size_t i = 0; i < envs.size(); ++i) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e; ++e) {
      std::string kv(*e);
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : envs[i]) vars[k] = v;
    std::vector<std::string> flat;
    for (const auto& [k, v] : vars) flat.push_back(k + "=" + v);
    std::vector<char*> envp, args;
    for (auto& s : flat) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& s : argv_copy) args.push_back(s.data());
    args.push_back(nullptr);
    logs.push_back((dir / ("weft_rank_" + std::to_string(::getpid()) + "_" + std::to_string(i) + ".log")).string());
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      throw std::runtime_error("run_processes: cannot start " + argv[0] + ": " + std::strerror(rc));
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(pids.size());
  std::vector<bool> done(pids.size(), false);
  const auto until = std::chrono::steady_clock::now() + deadline;
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --remaining;
        outcomes[i].exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > until) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
          outcomes[i].exit_status = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    std::ifstream in(logs[i]);
    std::stringstream text;
    text << in.rdbuf();
    outcomes[i].output = text.str();
    std::filesystem::remove(logs[i]);
  }
  return outcomes;
}

// The variables torchrun and weft-run give rank `rank` of `world_size` on one machine.
inline std::map<std::string, std::string> torchrun_env(int rank, int world_size, int port) {
  return {{"RANK", std::to_string(rank)},           {"WORLD_SIZE", std::to_string(world_size)},
          {"LOCAL_RANK", std::to_string(rank)},     {"LOCAL_WORLD_SIZE", std::to_string(world_size)},
          {"MASTER_ADDR", "127.0.0.1"},             {"MASTER_PORT", std::to_string(port)},
          {"OMP_NUM_THREADS", "1"}};
}

// Runs `argv` as ranks 0 .. world_size - 1 of a job (torchrun's variables, a fresh port).
inline std::vector<RankOutcome> run_ranks(const std::vector<std::string>& argv, int world_size,
                                          std::chrono::seconds deadline,
                                          const std::map<std::string, std::string>& extra = {}) {
  const int port = free_port();
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < world_size; ++r) {
    auto env = torchrun_env(r, world_size, port);
    for (const auto& [k, v] : extra) env[k] = v;
    envs.push_back(env);
  }
  return run_processes(argv, envs, deadline);
}

// Every rank exited 0; a failure shows the rank's status and output.
inline void check_all_ok(const std::vector<RankOutcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].exit_status == 0, "rank ", r, " exited ", outcomes[r].exit_status, ":\n",
                  outcomes[r].output);
  }
}

// Every rank exited 0 (a scenario whose ranks must fail says so in 0-exits) and printed each
// of the texts said(r): what rank r must have said.
inline void check_all_said(const std::vector<RankOutcome>& outcomes,
                           const std::function<std::vector<std::string>(size_t r)>& said) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].exit_status == 0, outcomes[r].output);
    for (const std::string& text : said(r)) {
      CAPTURE(text);
      CHECK_MESSAGE(outcomes[r].output.find(text) != std::string::npos, outcomes[r].output);
    }
  }
}

}  // namespace weft::test
