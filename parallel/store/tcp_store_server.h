// TCPStoreServer: the thread that serves a TCPStore's keys (parallel/store/tcp_store.h).
//
// Note [TCPStore server]
// One thread, one poll() over the listening socket, a wake-up pipe and every client.
// Sockets are non-blocking; each client has an input buffer (requests may arrive in
// pieces) and an output buffer (replies wait for POLLOUT when the socket is full). A Get
// or Wait whose keys are not all set becomes the client's Pending record: it watches its
// first missing key only (watchers_), moves on when that key is set, and is answered
// when none is missing or, with the missing keys, at its deadline, which also bounds
// poll()'s sleep. Setting n keys that n waits watch is therefore O(n) work, not O(n^2).
// Everything but the wake-up pipe is touched by the server thread alone: no locks.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "parallel/store/tcp_store_protocol.h"

namespace weft::parallel {

class TCPStoreServer {
  using Clock = tcp_wire::Clock;
  using Command = tcp_wire::Command;
  using Fd = tcp_wire::Fd;
  using Parser = tcp_wire::Parser;
  using Writer = tcp_wire::Writer;

 public:
  // Binds and listens on host:port (0: an ephemeral port), then starts the thread.
  TCPStoreServer(const std::string& host, uint16_t port);
  ~TCPStoreServer();  // wakes the thread and joins it; the clients see their connections close
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;
  uint16_t port() const { return port_; }
  pid_t owner() const { return owner_; }

 private:
  struct Pending {
    Command command;  // Get or Wait
    std::vector<std::string> keys;
    size_t cursor = 0;  // keys before it were set when last looked at
    Clock::time_point deadline;
  };
  struct Client {
    Fd fd;
    std::string in, out;
    size_t in_pos = 0, out_pos = 0;
    bool greeted = false, closed = false;
    std::optional<Pending> pending;
  };

  void run();
  void serve();
  void accept_clients();
  void read_from(Client& c);
  void process(uint64_t id, Client& c);
  bool handle(uint64_t id, Client& c, Parser& p);
  void reply(Client& c, Writer& w);
  void flush(Client& c);
  void start_wait(uint64_t id, Client& c, Command command, std::vector<std::string> keys, int64_t timeout_ms);
  void advance(uint64_t id, Client& c);
  void key_set(const std::string& key);
  void unwatch(uint64_t id, const Pending& w);
  void expire(Clock::time_point now);

  Fd listen_;
  Fd wake_read_, wake_write_;
  uint16_t port_ = 0;
  pid_t owner_ = ::getpid();  // a fork()ed child has a copy of this object, not the thread
  std::optional<Clock::time_point> accept_paused_;  // out of descriptors: accept again later
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<uint64_t, Client> clients_;  // by connection number (fds get reused)
  std::unordered_map<std::string, std::vector<uint64_t>> watchers_;  // key -> waits stopped at it
  std::vector<uint64_t> runnable_;  // clients whose wait ended, maybe with requests queued behind it
  uint64_t next_id_ = 1;
  std::thread thread_;
};

}  // namespace weft::parallel
