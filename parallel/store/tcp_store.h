// TCPStore: the Store that a job's ranks reach over TCP (PyTorch's c10d TCPStore).
//
// One TCPStore, constructed with is_server = true (rank 0 or the launcher), runs the
// server on a background thread that listens on host:port; every TCPStore, the server's
// owner included, is a client holding one connection to it. A client keeps trying to
// connect until its timeout, so ranks may start before the server does.
//
// The server is one thread with a poll() loop: a get() or wait() for keys nobody has set
// yet is a record on the server, not a blocked thread, so one slow rank never holds up
// the others, and stopping the server is one wake-up and a join. The server also owns
// the timeouts of pending waits (each request carries its timeout, the server answers
// "timed out" with the keys still missing), so a client's connection stays in step after
// a timeout; the client bounds its own wait too (the timeout plus a margin), so a server
// that stops answering is an error, never a hang. The protocol is in tcp_store_protocol.h.
//
// Every method may be called from several threads at once: each request borrows one of
// the store's connections, opening another when the others are busy, so a thread waiting
// in get() does not hold up another thread's set(). Once a connection fails (the server
// went away, a reply never came) every later call fails at once, saying why. A child
// process made by fork() that uses an inherited store gets connections of its own (and
// no server: destroying an inherited server's owner there leaves the parent's server be).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/store/store.h"

namespace weft::parallel {

class TCPStoreServer;  // the listening thread (tcp_store_server.h)

class TCPStore final : public Store {
 public:
  // host: a name or IPv4 address; the server binds to it ("0.0.0.0": every interface,
  // its own client then connects to 127.0.0.1). port 0 (servers only): an ephemeral port,
  // reported by port(). `timeout` bounds connecting and every wait.
  TCPStore(std::string host, uint16_t port, bool is_server, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~TCPStore() override;  // stops and joins the server (if this store runs it); never throws
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::set;
  using Store::wait;

  const std::string& host() const { return host_; }
  // The server's port: the one given, or the ephemeral one the server got for port 0.
  uint16_t port() const { return port_; }
  bool is_server() const { return server_ != nullptr; }

  class Client;  // this store's connections to the server (tcp_store.cpp)

 private:
  std::string host_;
  uint16_t port_;
  std::unique_ptr<TCPStoreServer> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace weft::parallel
