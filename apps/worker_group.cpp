// weft-run's Group: start, relay, supervise and stop one round of workers. See
// Note [No orphans, no unbounded waits, whole lines] in worker_group.h.
#include "worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace weft::run {
namespace {

int g_wake_read = -1, g_wake_write = -1;  // the self-pipe
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_stop_count = 0;

void on_signal(int sig) {
  const int saved_errno = errno;
  if (sig != SIGCHLD) {
    if (g_stop_signal == 0) g_stop_signal = sig;
    g_stop_count = g_stop_count + 1;
  }
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(g_wake_write, &byte, 1);  // full pipe: a wake-up is pending anyway
  errno = saved_errno;
}

// Blocking-style write of everything; a stdout that someone made non-blocking is waited
// for. On a closed or failing target the output is dropped and supervision goes on.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
    } else if (!(n < 0 && errno == EINTR)) {
      return;
    }
  }
}

// A line longer than this without a newline is written as a line of its own, so that a
// worker that never writes a newline cannot grow weft-run's memory without bound.
constexpr size_t kMaxLine = 1 << 16;
// After SIGKILL, how long to wait before giving up on a process (uninterruptible sleep).
constexpr std::chrono::seconds kKillTimeout{10};
// The most one drain reads: leftover descendants may keep a pipe busy after a worker ends.
constexpr int kDrainReads = 16;

}  // namespace

std::string ExitStatus::str() const {
  if (!signaled) return "exited with status " + std::to_string(code);
  return "was killed by signal " + std::to_string(code) + " (" + signal_name(code) + ")" +
         (core_dumped ? ", core dumped" : "");
}

void install_signal_handlers() {
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) == -1) open("/dev/null", O_RDWR);  // takes the lowest free fd: this one
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error(std::string("pipe: ") + strerror(errno));
  g_wake_read = fds[0];
  g_wake_write = fds[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int stop_signal() { return g_stop_signal; }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : strsignal(sig);  // real-time signals have no name
}

void say(const std::string& message) { write_all(2, "weft-run: " + message + "\n"); }

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string stopped_clause(const RoundResult& r) {
  if (r.stopped.empty()) return "";
  std::string clause = "; stopped " + rank_list(r.stopped);
  if (!r.killed.empty()) clause += " (" + rank_list(r.killed) + " needed SIGKILL)";
  return clause;
}

Group::Group(GroupOptions options, const std::vector<int>& ranks, const std::vector<std::vector<std::string>>& envs)
    : options_(std::move(options)), workers_(ranks.size()) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    Worker& w = workers_[i];
    w.rank = ranks[i];
    w.prefix = options_.prefix ? "[rank " + std::to_string(w.rank) + "] " : "";
    w.env = envs[i];
    w.out.target = 1;
    w.err.target = 2;
  }
}

Group::~Group() {
  for (const Worker& w : workers_) signal_group(w, SIGKILL);
  const auto give_up_at = Clock::now() + kKillTimeout;
  for (Worker& w : workers_) {
    while (w.pid > 0 && !w.reaped && Clock::now() < give_up_at) {
      if (waitpid(w.pid, nullptr, WNOHANG) == w.pid)
        w.reaped = true;
      else
        poll(nullptr, 0, 10);
    }
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) close(s->fd);
  }
}

RoundResult Group::run() {
  for (Worker& w : workers_) {
    if (stop_signal() != 0) break;  // told to stop while starting: start no more
    if (!start(w)) {
      begin_stop();
      break;
    }
  }
  supervise();
  finish();
  return result_;
}

// fork + execvpe with the worker's environment, its stdout and stderr on pipes, stdin on
// /dev/null (a worker in its own process group must not read the terminal: SIGTTIN).
// An exec failure comes back as the child's errno through a close-on-exec pipe: nothing
// to read means the exec succeeded.
bool Group::start(Worker& w) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0) {
    const int pipe_errno = errno;
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]})
      if (fd >= 0) close(fd);
    result_.outcome = RoundResult::Outcome::LaunchFailed;
    result_.error = "cannot start rank " + std::to_string(w.rank) + ": pipe: " + strerror(pipe_errno);
    return false;
  }
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (std::string& a : options_.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : w.env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // weft-run died before prctl took effect
    signal(SIGPIPE, SIG_DFL);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out[1], 1);  // dup2 clears close-on-exec on 1 and 2; the originals close at exec
    dup2(err[1], 2);
    execvpe(argv[0], argv.data(), envp.data());
    const int exec_errno = errno;
    [[maybe_unused]] ssize_t n = write(status[1], &exec_errno, sizeof exec_errno);
    _exit(127);
  }
  const int fork_errno = errno;
  close(out[1]);
  close(err[1]);
  close(status[1]);
  if (pid < 0) {
    for (int fd : {out[0], err[0], status[0]}) close(fd);
    result_.outcome = RoundResult::Outcome::LaunchFailed;
    result_.error = "cannot start rank " + std::to_string(w.rank) + ": fork: " + strerror(fork_errno);
    return false;
  }
  setpgid(pid, pid);  // the child does it too: whichever runs first, the group exists before anyone signals it
  w.pid = pid;
  w.running = true;
  w.out.fd = out[0];
  w.err.fd = err[0];
  for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  int exec_errno = 0;
  ssize_t n;
  do n = read(status[0], &exec_errno, sizeof exec_errno);  // returns at exec or at _exit: bounded
  while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n != static_cast<ssize_t>(sizeof exec_errno)) return true;
  const std::string& program = options_.argv[0];
  result_.outcome = RoundResult::Outcome::LaunchFailed;
  result_.launch_exit_code = 127;
  result_.error =
      "cannot execute '" + program + "': " +
      (exec_errno == ENOENT && program.find('/') == std::string::npos ? std::string("no such program on PATH")
                                                                      : std::string(strerror(exec_errno)));
  // The child is exiting (127) now: reap it here, so it is not counted among the ranks stopped.
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  w.running = false;
  w.reaped = true;
  drain(w, w.out);
  drain(w, w.err);
  return false;
}

void Group::supervise() {
  bool check_exits = true;
  auto last_check = Clock::now();
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> owners;  // fds[i + 1] belongs to owners[i]
  for (;;) {
    // A stop signal while the workers are stopped after a failure keeps the failure (the
    // caller sees stop_signal() and starts no new round).
    if (stop_signal() != 0 && result_.outcome != RoundResult::Outcome::Interrupted &&
        result_.outcome != RoundResult::Outcome::LaunchFailed && result_.outcome != RoundResult::Outcome::Failed) {
      result_.outcome = RoundResult::Outcome::Interrupted;
      result_.signal = stop_signal();
      std::vector<int> running;
      for (const Worker& w : workers_)
        if (w.running) running.push_back(w.rank);
      char grace[32];
      snprintf(grace, sizeof grace, "%g", options_.grace.count());
      say("got " + signal_name(result_.signal) +
          (running.empty() ? std::string()
                           : ": stopping " + rank_list(running) + " (SIGTERM, then SIGKILL after " + grace + " s)"));
      begin_stop();
    }
    if (!any_running()) break;
    const auto now = Clock::now();
    if (options_.watch && now >= next_watch_) {
      next_watch_ = now + options_.watch_every;
      std::string reason = options_.watch();
      if (!reason.empty() && !stopping_) {
        result_.outcome = RoundResult::Outcome::Ended;
        result_.error = std::move(reason);
        begin_stop();
      }
    }
    // A second SIGINT / SIGTERM while stopping for the first: no more grace.
    const bool impatient = stop_signal() != 0 && g_stop_count >= 2;
    if (stopping_ && !killed_ && (now >= kill_at_ || impatient)) {
      if (impatient && now < kill_at_) say("got " + signal_name(stop_signal()) + " again: SIGKILL now");
      for (const Worker& w : workers_)
        if (w.running) result_.killed.push_back(w.rank);
      for (const Worker& w : workers_) signal_group(w, SIGKILL);
      killed_ = true;
      give_up_at_ = now + kKillTimeout;
    }
    if (killed_ && now >= give_up_at_) {
      for (const Worker& w : workers_)
        if (w.running) result_.stuck.push_back(w.rank);
      break;
    }

    fds.assign(1, pollfd{g_wake_read, POLLIN, 0});
    owners.clear();
    for (Worker& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back(pollfd{s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    // Without a pending deadline SIGCHLD wakes the loop; the 1 s bound is a safety net.
    constexpr auto kSafetyNet = std::chrono::milliseconds(1000);
    auto timeout = options_.watch ? std::min<std::chrono::milliseconds>(kSafetyNet, options_.watch_every) : kSafetyNet;
    if (stopping_) {
      const auto deadline = killed_ ? give_up_at_ : kill_at_;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      timeout = std::clamp(left, std::chrono::milliseconds(1), timeout);
    }
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + strerror(errno));
    if (Clock::now() - last_check >= kSafetyNet) check_exits = true;  // even while output keeps poll busy
    if (ready > 0) {
      if (fds[0].revents != 0) {
        char bytes[64];
        ssize_t n;
        while ((n = read(g_wake_read, bytes, sizeof bytes)) > 0)
          if (std::find(bytes, bytes + n, static_cast<char>(SIGCHLD)) != bytes + n) check_exits = true;
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents != 0) relay(*owners[i - 1].first, *owners[i - 1].second);
    }
    if (check_exits) {
      check_exits = false;
      last_check = Clock::now();
      for (Worker& w : workers_)
        if (w.running) observe_exit(w);
    }
  }
}

// Sees whether the worker has ended, without reaping it (see the Note in the header).
void Group::observe_exit(Worker& w) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
  w.running = false;
  w.status.signaled = info.si_code != CLD_EXITED;
  w.status.core_dumped = info.si_code == CLD_DUMPED;
  w.status.code = info.si_status;
  // Its last words come before anything weft-run says about it.
  drain(w, w.out);
  drain(w, w.err);
  if (!w.status.ok() && result_.outcome == RoundResult::Outcome::Succeeded) {
    result_.outcome = RoundResult::Outcome::Failed;
    result_.rank = w.rank;
    result_.pid = w.pid;
    result_.status = w.status;
    begin_stop();
  }
}

void Group::begin_stop() {
  if (stopping_) return;
  stopping_ = true;
  for (const Worker& w : workers_)
    if (w.running) result_.stopped.push_back(w.rank);
  // Workers that have ended are signalled too: what they left behind in their group goes.
  for (const Worker& w : workers_) signal_group(w, SIGTERM);
  kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(options_.grace);
}

void Group::signal_group(const Worker& w, int sig) const {
  if (w.pid <= 0 || w.reaped) return;
  // Should the worker not be a group leader yet (it is from the moment fork returns, by
  // the parent's setpgid), the signal still reaches the worker itself.
  if (kill(-w.pid, sig) != 0 && w.running) kill(w.pid, sig);
}

bool Group::relay(const Worker& w, Stream& s) {
  char buffer[1 << 16];
  const ssize_t n = read(s.fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n <= 0) {
    close_stream(w, s);
    return false;
  }
  std::string lines;
  const std::string_view data(buffer, static_cast<size_t>(n));
  size_t begin = 0;
  for (size_t newline; (newline = data.find('\n', begin)) != std::string_view::npos; begin = newline + 1) {
    lines += w.prefix;
    lines += s.pending;
    lines += data.substr(begin, newline + 1 - begin);
    s.pending.clear();
  }
  s.pending += data.substr(begin);
  if (s.pending.size() >= kMaxLine) {
    lines += w.prefix + s.pending + "\n";
    s.pending.clear();
  }
  write_all(s.target, lines);
  return true;
}

void Group::drain(const Worker& w, Stream& s) {
  for (int i = 0; i < kDrainReads && s.fd >= 0; ++i) {
    pollfd p{s.fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || !relay(w, s)) return;
  }
}

// End of file (or the end of the round): a last line without a newline is written now.
void Group::close_stream(const Worker& w, Stream& s) {
  if (s.fd < 0) return;
  if (!s.pending.empty()) write_all(s.target, w.prefix + s.pending + "\n");
  s.pending.clear();
  close(s.fd);
  s.fd = -1;
}

void Group::finish() {
  // Each worker's group is killed while its leader is still an unreaped zombie, so the id
  // cannot have been reused: this reaches only what the worker left behind.
  for (const Worker& w : workers_) signal_group(w, SIGKILL);
  for (Worker& w : workers_) {
    if (w.pid > 0 && !w.reaped && !w.running) {  // a zombie: returns at once
      while (waitpid(w.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    } else if (w.pid > 0 && !w.reaped) {  // stuck even after SIGKILL: one last look; init adopts it later
      waitpid(w.pid, nullptr, WNOHANG);
    }
    w.reaped = true;
    drain(w, w.out);
    drain(w, w.err);
    close_stream(w, w.out);
    close_stream(w, w.err);
  }
}

bool Group::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

}  // namespace weft::run
