// TCPStore's client: connections to the server (Note [TCPStore protocol] in
// tcp_store_protocol.h), lent to one request at a time, and the Store operations.
#include "parallel/store/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/error.h"
#include "parallel/store/store_detail.h"
#include "parallel/store/tcp_store_protocol.h"
#include "parallel/store/tcp_store_server.h"

namespace weft::parallel {

using namespace tcp_wire;
using store_detail::clamp_timeout;
using store_detail::errno_text;
using store_detail::quoted_keys;

namespace {

// A socket call that failed: the connection is unusable from then on.
struct IoFailure {
  std::string reason;
};

// One socket to the server, used by one thread at a time (TCPStore::Client lends them).
class Connection {
 public:
  Connection(std::string host, uint16_t port, milliseconds timeout)
      : host_(std::move(host)), port_(port), timeout_(timeout) {
    connect();
  }

  // Sends one request and reads its reply with read_ok(*this, deadline) when the status
  // is Ok. `wait` is the server-side timeout of a Get or Wait (nullopt for the others).
  // A socket error, or no reply by the deadline, leaves failure() set: the connection is
  // out of step with the server and must not be used again.
  template <class ReadOk>
  auto request(const std::string& what, const std::string& message, milliseconds io_timeout,
               std::optional<milliseconds> wait, ReadOk&& read_ok) {
    const milliseconds budget = wait ? *wait + kReplyMargin : std::max(io_timeout, kReplyMargin);
    const Clock::time_point deadline = Clock::now() + budget;
    Status status = Status::Ok;
    std::string error;
    std::vector<std::string> missing;
    try {
      send_all(message, deadline);
      status = static_cast<Status>(u8(deadline));
      if (status == Status::Ok) return read_ok(*this, deadline);
      if (status == Status::Timeout) missing = strs(deadline);
      if (status == Status::Error) error = str(deadline);
      if (status != Status::Timeout && status != Status::Error) throw IoFailure{"an unknown reply from the server"};
    } catch (const IoFailure& f) {
      failure_ = f.reason;
      if (f.reason == "no reply") failure_ += " within " + std::to_string(budget.count()) + " ms";
      fd_.reset();
      WEFT_FAIL(what, ": the connection to the TCPStore server at ", address(), " failed: ", failure_);
    }
    if (status == Status::Error) WEFT_FAIL(what, ": ", error);
    WEFT_FAIL(what, ": timed out after ", (wait ? *wait : milliseconds(0)).count(), " ms waiting for ",
              missing.size() == 1 ? "key " : "keys ", quoted_keys(missing), " (TCPStore server ", address(), ")");
  }

  const std::string& failure() const { return failure_; }

  uint8_t u8(Clock::time_point deadline) { return static_cast<uint8_t>(fixed(1, deadline)); }
  uint32_t u32(Clock::time_point deadline) { return static_cast<uint32_t>(fixed(4, deadline)); }
  int64_t i64(Clock::time_point deadline) { return static_cast<int64_t>(fixed(8, deadline)); }
  std::string str(Clock::time_point deadline) {
    const uint32_t n = u32(deadline);
    if (n > kMaxString) throw IoFailure{"a malformed reply from the server"};
    fill(n, deadline);
    std::string s = rbuf_.substr(rpos_, n);
    rpos_ += n;
    return s;
  }
  std::vector<std::string> strs(Clock::time_point deadline) {
    const uint32_t n = u32(deadline);
    if (n > kMaxKeys) throw IoFailure{"a malformed reply from the server"};
    std::vector<std::string> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(str(deadline));
    return out;
  }

 private:
  std::string address() const { return host_ + ":" + std::to_string(port_); }

  // Tries until the timeout: the server may start after its clients.
  void connect() {
    const auto start = Clock::now(), deadline = start + clamp_timeout(timeout_);
    std::string last_error = "no attempt";
    int attempts = 0;
    for (milliseconds backoff(5);; backoff = std::min(backoff * 2, milliseconds(100))) {
      ++attempts;
      if (try_connect(deadline, last_error)) {
        try {
          Writer hello(Command::Hello);
          send_all(hello.u32(kMagic).u32(kVersion).data(), deadline);
          if (static_cast<Status>(u8(deadline)) == Status::Ok) return;
          last_error = "the peer does not speak the TCPStore protocol";
        } catch (const IoFailure& f) {
          last_error = "no greeting: " + f.reason + " (is this port a weft TCPStore of the same version?)";
        }
        fd_.reset();
        break;  // something answers on that port, and it is not our server: retrying will not help
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    }
    const auto tried = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    WEFT_FAIL("TCPStore: could not connect to the server at ", address(), " (tried ", attempts, " times over ",
              tried.count(), " ms, timeout ", timeout_.count(), " ms; last error: ", last_error, ")");
  }

  bool try_connect(Clock::time_point deadline, std::string& error) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port_);
    if (const int rc = ::getaddrinfo(host_.c_str(), service.c_str(), &hints, &found); rc != 0) {
      error = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
      return false;
    }
    for (addrinfo* a = found; a && fd_.get() < 0; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) {
        error = errno_text(errno);
        continue;
      }
      int err = ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        int r;
        while ((r = ::poll(&p, 1, poll_ms(deadline - Clock::now()))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof err;
        if (r == 0) err = ETIMEDOUT;
        else if (r < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
      if (err == 0 && connected_to_itself(fd.get())) err = ECONNREFUSED;
      if (err != 0) {
        error = errno_text(err);
        continue;
      }
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      set_no_sigpipe(fd.get());
      fd_ = std::move(fd);
    }
    ::freeaddrinfo(found);
    return fd_.get() >= 0;
  }

  // With no server on an ephemeral-range port of this host, TCP's simultaneous open can
  // connect a socket to itself; that is "nobody listens", not a server.
  static bool connected_to_itself(int fd) {
    sockaddr_in local{}, peer{};
    socklen_t a = sizeof local, b = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &a) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0)
      return false;
    return local.sin_port == peer.sin_port && local.sin_addr.s_addr == peer.sin_addr.s_addr;
  }

  void await(short events, Clock::time_point deadline) {
    for (;;) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) throw IoFailure{"no reply"};
      pollfd p{fd_.get(), events, 0};
      const int r = ::poll(&p, 1, poll_ms(left));
      if (r > 0) return;  // ready, or hung up: the next send / recv says which
      if (r < 0 && errno != EINTR) throw IoFailure{"poll: " + errno_text(errno)};
    }
  }

  void send_all(std::string_view data, Clock::time_point deadline) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_.get(), data.data(), data.size(), kSendFlags);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        await(POLLOUT, deadline);
      } else if (n < 0 && errno != EINTR) {
        throw IoFailure{errno == EPIPE || errno == ECONNRESET ? "the server closed the connection (" +
                                                                    errno_text(errno) + ")"
                                                              : errno_text(errno)};
      }
    }
  }

  void fill(size_t n, Clock::time_point deadline) {
    if (rpos_ == rbuf_.size()) {
      rbuf_.clear();
      rpos_ = 0;
    }
    char chunk[1 << 16];
    while (rbuf_.size() - rpos_ < n) {
      const ssize_t got = ::recv(fd_.get(), chunk, sizeof chunk, 0);
      if (got > 0) {
        rbuf_.append(chunk, static_cast<size_t>(got));
      } else if (got == 0) {
        throw IoFailure{"the server closed the connection"};
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        await(POLLIN, deadline);
      } else if (errno != EINTR) {
        throw IoFailure{errno == ECONNRESET ? "the server closed the connection (" + errno_text(errno) + ")"
                                            : errno_text(errno)};
      }
    }
  }

  uint64_t fixed(int bytes, Clock::time_point deadline) {
    fill(static_cast<size_t>(bytes), deadline);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(rbuf_[rpos_ + i])) << (8 * i);
    rpos_ += static_cast<size_t>(bytes);
    return v;
  }

  std::string host_;
  uint16_t port_;
  milliseconds timeout_;  // for connecting
  Fd fd_;
  std::string failure_;  // why the connection failed; empty while it works
  std::string rbuf_;
  size_t rpos_ = 0;
};

}  // namespace

// The connections of one TCPStore: a request borrows an idle one, or opens another when
// other threads hold them all, so a thread waiting in get() never holds up another
// thread's set() on the same store. A connection that failed is dropped, and the store
// fails every later request at once (the server is gone or stopped answering: waiting
// for a new connection would only delay the error).
class TCPStore::Client {
 public:
  Client(std::string host, uint16_t port, milliseconds timeout)
      : host_(std::move(host)), port_(port), pid_(::getpid()) {
    idle_.push_back(std::make_unique<Connection>(host_, port_, timeout));
  }

  template <class ReadOk>
  auto request(const std::string& what, const std::string& message, milliseconds io_timeout,
               std::optional<milliseconds> wait, ReadOk&& read_ok) {
    struct Lent {
      Client& client;
      std::unique_ptr<Connection> connection;
      ~Lent() { client.give_back(std::move(connection)); }
    } lent{*this, borrow(what, io_timeout)};
    return lent.connection->request(what, message, io_timeout, wait, read_ok);
  }

 private:
  std::unique_ptr<Connection> borrow(const std::string& what, milliseconds timeout) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pid_ != ::getpid()) {  // a fork()ed child: the sockets are the parent's
        idle_.clear();           // closes the child's copies only
        failure_.clear();
        pid_ = ::getpid();
      }
      WEFT_CHECK(failure_.empty(), what, ": the connection to the TCPStore server at ", host_, ":", port_,
                 " failed earlier (", failure_, ")");
      if (!idle_.empty()) {
        std::unique_ptr<Connection> c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    return std::make_unique<Connection>(host_, port_, timeout);
  }

  void give_back(std::unique_ptr<Connection> c) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pid_ != ::getpid()) return;
    if (!c->failure().empty()) {
      if (failure_.empty()) failure_ = c->failure();
      return;
    }
    try {
      idle_.push_back(std::move(c));
    } catch (...) {  // out of memory: the connection closes, the next request opens another
    }
  }

  std::string host_;
  uint16_t port_;
  std::mutex mutex_;  // guards the fields below, never held during a request
  pid_t pid_;         // the process the connections belong to
  std::vector<std::unique_ptr<Connection>> idle_;
  std::string failure_;  // why a connection failed; empty while none has
};

// ---- TCPStore --------------------------------------------------------------------------

namespace {

std::string_view view(const Bytes& b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

std::string describe(const char* op, const std::string& key) { return std::string("TCPStore ") + op + "('" + key + "')"; }

void check_size(const std::string& what, size_t size) {
  WEFT_CHECK(size <= kMaxString, what, ": a key or value of ", size, " bytes is over the limit of ", kMaxString);
}

}  // namespace

TCPStore::TCPStore(std::string host, uint16_t port, bool is_server, std::chrono::milliseconds timeout)
    : Store(timeout), host_(std::move(host)), port_(port) {
  if (is_server) {
    server_ = std::make_unique<TCPStoreServer>(host_, port_);
    port_ = server_->port();
  }
  WEFT_CHECK(port_ != 0, "TCPStore: a client needs the server's port (port 0 asks a server for an ephemeral one); host ",
             host_);
  const bool any = host_.empty() || host_ == "0.0.0.0";
  client_ = std::make_unique<Client>(is_server && any ? "127.0.0.1" : host_, port_, timeout);
}

TCPStore::~TCPStore() {
  client_.reset();
  // In a fork()ed child the server thread does not exist and the wake-up pipe is the
  // parent's: the copy of the server's state is left alone.
  if (server_ && server_->owner() != ::getpid()) (void)server_.release();
  server_.reset();  // wakes the server thread and joins it; its clients see their connections close
}

void TCPStore::set(const std::string& key, const Bytes& value) {
  const std::string what = describe("set", key);
  check_size(what, key.size());
  check_size(what, value.size());
  Writer w(Command::Set);
  w.str(key).str(view(value));
  client_->request(what, w.data(), timeout(), std::nullopt, [](Connection&, Clock::time_point) {});
}

Bytes TCPStore::get(const std::string& key) {
  const std::string what = describe("get", key);
  check_size(what, key.size());
  const milliseconds wait = clamp_timeout(timeout());
  Writer w(Command::Get);
  w.str(key).i64(wait.count());
  return client_->request(what, w.data(), timeout(), wait,
                          [](Connection& c, Clock::time_point deadline) { return to_bytes(c.str(deadline)); });
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  const std::string what = describe("add", key);
  check_size(what, key.size());
  Writer w(Command::Add);
  w.str(key).i64(delta);
  return client_->request(what, w.data(), timeout(), std::nullopt,
                          [](Connection& c, Clock::time_point deadline) { return c.i64(deadline); });
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string what = describe("compare_set", key);
  check_size(what, key.size());
  check_size(what, expected.size());
  check_size(what, desired.size());
  Writer w(Command::CompareSet);
  w.str(key).str(view(expected)).str(view(desired));
  return client_->request(what, w.data(), timeout(), std::nullopt,
                          [](Connection& c, Clock::time_point deadline) { return to_bytes(c.str(deadline)); });
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  WEFT_CHECK(keys.size() <= kMaxKeys, "TCPStore check: ", keys.size(), " keys is over the limit of ", kMaxKeys);
  for (const std::string& k : keys) check_size("TCPStore check", k.size());
  Writer w(Command::Check);
  w.strs(keys);
  return client_->request("TCPStore check", w.data(), timeout(), std::nullopt,
                          [](Connection& c, Clock::time_point deadline) { return c.u8(deadline) != 0; });
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  WEFT_CHECK(keys.size() <= kMaxKeys, "TCPStore wait: ", keys.size(), " keys is over the limit of ", kMaxKeys);
  for (const std::string& k : keys) check_size("TCPStore wait", k.size());
  const milliseconds wait = clamp_timeout(timeout);
  Writer w(Command::Wait);
  w.strs(keys).i64(wait.count());
  client_->request("TCPStore wait", w.data(), this->timeout(), wait, [](Connection&, Clock::time_point) {});
}

bool TCPStore::delete_key(const std::string& key) {
  const std::string what = describe("delete_key", key);
  check_size(what, key.size());
  Writer w(Command::Delete);
  w.str(key);
  return client_->request(what, w.data(), timeout(), std::nullopt,
                          [](Connection& c, Clock::time_point deadline) { return c.u8(deadline) != 0; });
}

int64_t TCPStore::num_keys() {
  Writer w(Command::NumKeys);
  return client_->request("TCPStore num_keys", w.data(), timeout(), std::nullopt,
                          [](Connection& c, Clock::time_point deadline) { return c.i64(deadline); });
}

}  // namespace weft::parallel
