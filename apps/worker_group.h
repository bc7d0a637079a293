// weft-run's supervision of one round: N worker processes of one program, each in its own
// process group, their output relayed line by line, watched until they all succeed, one
// fails, or weft-run is told to stop. A restart is a new Group (see weft_run.cpp).
//
// Note [No orphans, no unbounded waits, whole lines]
// - A worker dies with weft-run (PR_SET_PDEATHSIG, SIGKILL) and is signalled as a process
//   group, so whatever it started goes with it. A worker's exit is *observed* with
//   waitid(WNOWAIT) and the zombie is reaped only at the end of the round, after its
//   group has been sent SIGKILL: while the zombie exists its pid cannot be reused, so
//   kill(-pgid) can only ever reach that worker's own descendants.
// - One poll() loop watches the output pipes and a self-pipe that the signal handlers
//   (SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT) write to; while a stop is under way the
//   poll timeout is the next deadline (SIGKILL after the grace period, then giving up on
//   a process that not even SIGKILL removes), so no wait is unbounded and none spins.
// - weft-run is single-threaded and writes each rank's complete lines with one write(),
//   so half lines of two ranks never interleave.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace weft::run {

// How a process ended.
struct ExitStatus {
  bool signaled = false;  // killed by signal `code`; else exited with status `code`
  bool core_dumped = false;
  int code = 0;

  bool ok() const { return !signaled && code == 0; }
  // "exited with status 3", "was killed by signal 9 (SIGKILL)"
  std::string str() const;
};

struct RoundResult {
  enum class Outcome { Succeeded, Failed, Interrupted, LaunchFailed, Ended };
  Outcome outcome = Outcome::Succeeded;
  int rank = -1;  // Failed: the first rank seen failing; its pid and how it ended
  pid_t pid = -1;
  ExitStatus status;
  int signal = 0;            // Interrupted: the signal weft-run received
  std::vector<int> stopped;  // ranks still running when weft-run began to stop the group
  std::vector<int> killed;   // of those, the ones still running after the grace period
  std::vector<int> stuck;    // of those, the ones that not even SIGKILL removed in time
  std::string error;         // LaunchFailed: what could not be started, and why; Ended: the watch's reason
  int launch_exit_code = 1;  // LaunchFailed: 127 when PROGRAM could not be executed
};

struct GroupOptions {
  std::vector<std::string> argv;  // PROGRAM, then its arguments
  bool prefix = true;             // "[rank R] " before every line
  std::chrono::duration<double> grace{5.0};
  // An elastic agent's look at its rendezvous (apps/elastic_agent.h): called about every
  // watch_every while the round runs, and on while it stops (heartbeats go on). A
  // non-empty answer while the workers run ends the round: they are stopped as after a
  // failure, and the outcome is Ended with that reason. What it throws ends run() (the
  // destructor then kills the workers).
  std::function<std::string()> watch;
  std::chrono::milliseconds watch_every{1000};
};

// Installs the handlers that wake the supervising loop, ignores SIGPIPE (a closed stdout
// must not take weft-run down before its workers; workers get the default back) and
// opens /dev/null on any of fds 0-2 that is closed. Call once, before the first Group.
void install_signal_handlers();
// The first of SIGINT / SIGTERM / SIGHUP / SIGQUIT that weft-run received; 0 when none.
int stop_signal();
// "SIGINT"; strsignal's text for signals without a name.
std::string signal_name(int sig);
// "weft-run: MESSAGE\n" to stderr, in one write.
void say(const std::string& message);
// "rank 3" or "ranks 0, 1, 3".
std::string rank_list(const std::vector<int>& ranks);
// "; stopped ranks 0, 1 (rank 1 needed SIGKILL)", or "" when no rank was stopped.
std::string stopped_clause(const RoundResult& r);

class Group {
 public:
  // ranks[i]: the global rank of local rank i; envs[i]: its whole environment ("NAME=value").
  Group(GroupOptions options, const std::vector<int>& ranks, const std::vector<std::vector<std::string>>& envs);
  // Kills and reaps whatever run() left behind (only after an exception).
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Starts every worker and supervises them until all have ended (or been stopped), then
  // kills each worker's process group and reaps it. Call once.
  RoundResult run();

 private:
  using Clock = std::chrono::steady_clock;

  // One of a worker's output pipes, relayed to weft-run's stdout or stderr.
  struct Stream {
    int fd = -1;          // read end, non-blocking; -1 once closed
    int target = 1;       // where its lines go
    std::string pending;  // bytes after the last newline
  };
  struct Worker {
    int rank = 0;
    std::string prefix;            // "[rank R] ", or empty
    std::vector<std::string> env;  // "NAME=value"
    pid_t pid = -1;                // also its process group id
    bool running = false;          // started, and its end not observed yet
    bool reaped = false;           // or given up on: still there after SIGKILL and kKillTimeout
    ExitStatus status;
    Stream out, err;
  };

  bool start(Worker& w);
  void supervise();
  void observe_exit(Worker& w);
  void begin_stop();
  void signal_group(const Worker& w, int sig) const;
  bool relay(const Worker& w, Stream& s);  // one read; false at end of file
  void drain(const Worker& w, Stream& s);  // what is there now (bounded), closed at end of file
  void close_stream(const Worker& w, Stream& s);
  void finish();
  bool any_running() const;

  GroupOptions options_;
  std::vector<Worker> workers_;
  RoundResult result_;
  bool stopping_ = false, killed_ = false;
  Clock::time_point kill_at_, give_up_at_, next_watch_;
};

}  // namespace weft::run
