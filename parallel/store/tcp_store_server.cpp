// TCPStoreServer: the poll() loop (Note [TCPStore server]) and the requests it answers
// (Note [TCPStore protocol]).
#include "parallel/store/tcp_store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "core/error.h"
#include "parallel/store/store_detail.h"

namespace weft::parallel {

using namespace tcp_wire;
using store_detail::clamp_timeout;
using store_detail::errno_text;

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  WEFT_CHECK(rc == 0, "TCPStore: cannot resolve '", host, "' to listen on: ", ::gai_strerror(rc));
  int err = 0;
  for (addrinfo* a = found; a && listen_.get() < 0; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    int one = 1;
    if (fd.get() < 0 || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        ::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      err = errno;
      continue;
    }
    listen_ = std::move(fd);
  }
  ::freeaddrinfo(found);
  WEFT_CHECK(listen_.get() >= 0, "TCPStore: cannot listen on ", host, ":", port, ": ", errno_text(err));
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  WEFT_CHECK(::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0,
             "TCPStore: getsockname on the listening socket failed: ", errno_text(errno));
  port_ = ntohs(bound.sin_port);
  int pipe_fds[2];
  WEFT_CHECK(::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) == 0, "TCPStore: pipe2 failed: ", errno_text(errno));
  wake_read_.reset(pipe_fds[0]);
  wake_write_.reset(pipe_fds[1]);
  thread_ = std::thread([this] { run(); });
}

TCPStoreServer::~TCPStoreServer() {
  const char byte = 1;
  while (::write(wake_write_.get(), &byte, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
}

void TCPStoreServer::run() {
  try {
    serve();
  } catch (...) {
    // Out of memory, most likely; the clients see their connections close.
  }
  clients_.clear();  // closes every client's socket
}

void TCPStoreServer::serve() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.clear();
    ids.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    std::optional<Clock::time_point> earliest = accept_paused_;
    if (accept_paused_ && *accept_paused_ <= Clock::now()) earliest = accept_paused_ = std::nullopt;
    fds.push_back({listen_.get(), static_cast<short>(accept_paused_ ? 0 : POLLIN), 0});
    for (auto& [id, c] : clients_) {
      const short events = POLLIN | (c.out_pos < c.out.size() ? POLLOUT : 0);
      fds.push_back({c.fd.get(), events, 0});
      ids.push_back(id);
      if (c.pending && (!earliest || c.pending->deadline < *earliest)) earliest = c.pending->deadline;
    }
    const int timeout = earliest ? poll_ms(*earliest - Clock::now()) : -1;
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;  // the destructor's wake-up
    if (fds[1].revents & POLLIN) accept_clients();
    for (size_t i = 2; i < fds.size(); ++i) {
      const short ev = fds[i].revents;
      auto it = clients_.find(ids[i - 2]);
      if (ev == 0 || it == clients_.end()) continue;
      if (ev & (POLLIN | POLLHUP | POLLERR)) {
        read_from(it->second);
        process(it->first, it->second);
      }
      if (ev & POLLOUT) flush(it->second);
    }
    for (int round = 0; round < 2; ++round) {
      if (round == 1) expire(Clock::now());
      while (!runnable_.empty()) {
        const uint64_t id = runnable_.back();
        runnable_.pop_back();
        if (auto it = clients_.find(id); it != clients_.end()) process(id, it->second);
      }
    }
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (!it->second.closed) {
        ++it;
        continue;
      }
      if (it->second.pending) unwatch(it->first, *it->second.pending);
      it = clients_.erase(it);
    }
  }
}

void TCPStoreServer::accept_clients() {
  for (;;) {
    Fd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      // EAGAIN: all taken. Out of descriptors or memory: the pending connection would keep
      // the socket readable and poll() spinning, so stop listening for a moment.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_paused_ = Clock::now() + milliseconds(100);
      return;
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_no_sigpipe(fd.get());
    clients_[next_id_++].fd = std::move(fd);
  }
}

void TCPStoreServer::read_from(Client& c) {
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), chunk, sizeof chunk, 0);
    if (n > 0) {
      c.in.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.closed = true;
    return;
  }
}

void TCPStoreServer::process(uint64_t id, Client& c) {
  // Requests already received are served even from a client that has hung up: a set
  // sent just before closing still counts.
  while (!c.pending && c.in_pos < c.in.size()) {
    Parser p(std::string_view(c.in).substr(c.in_pos));
    const bool handled = handle(id, c, p);
    if (!p.valid()) c.closed = true;
    if (!handled || !p.valid()) break;
    c.in_pos += p.consumed();
  }
  if (c.in_pos == c.in.size()) {
    c.in.clear();
    c.in_pos = 0;
  } else if (c.in_pos > (1u << 16) && c.in_pos > c.in.size() / 2) {
    c.in.erase(0, c.in_pos);
    c.in_pos = 0;
  }
}

// Parses every field before acting: a request still partly on its way has no effect.
bool TCPStoreServer::handle(uint64_t id, Client& c, Parser& p) {
  const auto command = static_cast<Command>(p.u8());
  if (p.complete() && !c.greeted && command != Command::Hello) p.invalidate();
  Writer ok(Status::Ok);
  switch (command) {
    case Command::Hello: {
      const uint32_t magic = p.u32(), version = p.u32();
      if (!p.complete()) return false;
      if (magic != kMagic || version != kVersion) p.invalidate();
      c.greeted = p.valid();
      if (c.greeted) reply(c, ok);
      return true;
    }
    case Command::Set: {
      std::string key = p.str(), value = p.str();
      if (!p.complete() || !p.valid()) return false;
      data_[key] = std::move(value);
      reply(c, ok);
      key_set(key);
      return true;
    }
    case Command::Get:
    case Command::Wait: {
      std::vector<std::string> keys;
      if (command == Command::Get)
        keys.push_back(p.str());
      else
        keys = p.strs();
      const int64_t timeout_ms = p.i64();
      if (!p.complete() || !p.valid()) return false;
      start_wait(id, c, command, std::move(keys), timeout_ms);
      return true;
    }
    case Command::Add: {
      std::string key = p.str();
      const int64_t delta = p.i64();
      if (!p.complete() || !p.valid()) return false;
      int64_t value = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        const std::string& s = it->second;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
          Writer e(Status::Error);
          e.str("the value of '" + key + "' is not a decimal integer: '" + s.substr(0, 40) + "'");
          reply(c, e);
          return true;
        }
      }
      if (__builtin_add_overflow(value, delta, &value)) {
        Writer e(Status::Error);
        e.str("adding " + std::to_string(delta) + " to '" + key + "' overflows int64");
        reply(c, e);
        return true;
      }
      data_[key] = std::to_string(value);
      reply(c, ok.i64(value));
      key_set(key);
      return true;
    }
    case Command::CompareSet: {
      std::string key = p.str(), expected = p.str(), desired = p.str();
      if (!p.complete() || !p.valid()) return false;
      auto it = data_.find(key);
      if (it == data_.end() ? expected.empty() : it->second == expected) {
        data_[key] = desired;
        reply(c, ok.str(desired));
        key_set(key);
      } else {
        reply(c, ok.str(it == data_.end() ? std::string() : it->second));
      }
      return true;
    }
    case Command::Check: {
      const std::vector<std::string> keys = p.strs();
      if (!p.complete() || !p.valid()) return false;
      const bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k); });
      reply(c, ok.u8(all));
      return true;
    }
    case Command::Delete: {
      const std::string key = p.str();
      if (!p.complete() || !p.valid()) return false;
      reply(c, ok.u8(data_.erase(key) > 0));
      return true;
    }
    case Command::NumKeys:
      if (!p.complete()) return false;
      reply(c, ok.i64(static_cast<int64_t>(data_.size())));
      return true;
  }
  if (p.complete()) p.invalidate();  // an unknown command
  return false;
}

void TCPStoreServer::reply(Client& c, Writer& w) {
  c.out += w.data();
  flush(c);
}

void TCPStoreServer::flush(Client& c) {
  while (c.out_pos < c.out.size() && !c.closed) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, kSendFlags);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // POLLOUT resumes
    } else {
      c.closed = true;
    }
  }
  c.out.clear();
  c.out_pos = 0;
}

void TCPStoreServer::start_wait(uint64_t id, Client& c, Command command, std::vector<std::string> keys,
                                  int64_t timeout_ms) {
  const milliseconds timeout = clamp_timeout(milliseconds(timeout_ms));
  c.pending = Pending{command, std::move(keys), 0, Clock::now() + timeout};
  advance(id, c);
}

// Moves a wait past the keys that are set; answers it when none is missing, else
// watches the first missing one.
void TCPStoreServer::advance(uint64_t id, Client& c) {
  Pending& w = *c.pending;
  auto is_set = [&](const std::string& k) { return data_.count(k) > 0; };
  while (w.cursor < w.keys.size() && is_set(w.keys[w.cursor])) ++w.cursor;
  if (w.cursor == w.keys.size()) {
    // A key passed earlier may have been deleted since: look once more from the start.
    w.cursor = std::find_if_not(w.keys.begin(), w.keys.end(), is_set) - w.keys.begin();
    if (w.cursor == w.keys.size()) {
      Writer ok(Status::Ok);
      if (w.command == Command::Get) ok.str(data_[w.keys[0]]);
      c.pending.reset();
      reply(c, ok);
      runnable_.push_back(id);
      return;
    }
  }
  watchers_[w.keys[w.cursor]].push_back(id);
}

void TCPStoreServer::key_set(const std::string& key) {
  auto found = watchers_.find(key);
  if (found == watchers_.end()) return;
  const std::vector<uint64_t> ids = std::move(found->second);
  watchers_.erase(found);
  for (uint64_t id : ids) {
    auto it = clients_.find(id);
    if (it == clients_.end()) continue;
    Client& c = it->second;
    if (c.pending && c.pending->cursor < c.pending->keys.size() && c.pending->keys[c.pending->cursor] == key)
      advance(id, c);
  }
}

void TCPStoreServer::unwatch(uint64_t id, const Pending& w) {
  if (w.cursor >= w.keys.size()) return;
  auto found = watchers_.find(w.keys[w.cursor]);
  if (found == watchers_.end()) return;
  std::erase(found->second, id);
  if (found->second.empty()) watchers_.erase(found);
}

void TCPStoreServer::expire(Clock::time_point now) {
  for (auto& [id, c] : clients_) {
    if (!c.pending || c.pending->deadline > now) continue;
    std::vector<std::string> missing;
    for (const std::string& k : c.pending->keys)
      if (!data_.count(k)) missing.push_back(k);
    unwatch(id, *c.pending);
    c.pending.reset();
    Writer w(Status::Timeout);
    reply(c, w.strs(missing));
    runnable_.push_back(id);
  }
}

}  // namespace weft::parallel
