// The TCPStore wire format, shared by its server (tcp_store_server.cpp) and its client
// (tcp_store.cpp); internal to the two.
//
// Note [TCPStore protocol]
// Integers are little-endian and fixed-width; str = u32 length + that many bytes.
// A request is a u8 command and its fields:
//   Hello       u32 magic "WEFT", u32 version     (first on every connection)
//   Set         str key, str value
//   Get         str key, i64 timeout_ms
//   Add         str key, i64 delta
//   CompareSet  str key, str expected, str desired
//   Check       u32 n, n x str key
//   Wait        u32 n, n x str key, i64 timeout_ms
//   Delete      str key
//   NumKeys     -
// A reply is a u8 status and its fields:
//   Ok          Hello, Set, Wait: -; Get, CompareSet: str value; Add, NumKeys: i64;
//               Check, Delete: u8 (0 or 1)
//   Timeout     u32 n, n x str key still missing  (Get and Wait, after their timeout_ms)
//   Error       str message                       (add on a value that is not an integer)
// A client sends its next request after the reply to the previous one. The server closes
// a connection whose bytes cannot be a request (unknown command, no Hello first, a string
// over kMaxString): a port scanner or a stray client costs a connection, not the server.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::parallel::tcp_wire {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class Command : uint8_t { Hello = 1, Set, Get, Add, CompareSet, Check, Wait, Delete, NumKeys };
enum class Status : uint8_t { Ok = 0, Timeout = 1, Error = 2 };
inline constexpr uint32_t kMagic = 0x54464557;  // the bytes "WEFT"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMaxString = 1u << 30;  // a longer "key" or "value" is a stray peer's bytes
inline constexpr uint32_t kMaxKeys = 1u << 20;
// How much longer than the server's own deadline a client waits for the answer, and the
// least time any request has to get one (a store timeout of 0 means "do not wait for
// keys", not "the network must be instantaneous").
inline constexpr milliseconds kReplyMargin{1000};
#ifdef MSG_NOSIGNAL
inline constexpr int kSendFlags = MSG_NOSIGNAL;  // a peer that went away is an EPIPE, not a SIGPIPE
#else
inline constexpr int kSendFlags = 0;  // SO_NOSIGPIPE is set on every socket instead
#endif

inline int poll_ms(Clock::duration left) {
  const auto ms = std::chrono::ceil<milliseconds>(left).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

inline void set_no_sigpipe([[maybe_unused]] int fd) {
#ifdef SO_NOSIGPIPE
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
}

// A descriptor closed when it goes away.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Builds one request or reply.
class Writer {
 public:
  explicit Writer(Command c) { u8(static_cast<uint8_t>(c)); }
  explicit Writer(Status s) { u8(static_cast<uint8_t>(s)); }
  Writer& u8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  Writer& strs(const std::vector<std::string>& ss) {
    u32(static_cast<uint32_t>(ss.size()));
    for (const std::string& s : ss) str(s);
    return *this;
  }
  std::string& data() { return out_; }

 private:
  std::string out_;
};

// Reads one request from the bytes that have arrived so far: complete() is false while
// part of it is still on its way, valid() false once the bytes cannot be a request.
class Parser {
 public:
  explicit Parser(std::string_view in) : in_(in) {}
  uint8_t u8() { return have(1) ? static_cast<uint8_t>(in_[pos_++]) : 0; }
  uint32_t u32() { return static_cast<uint32_t>(fixed(4)); }
  int64_t i64() { return static_cast<int64_t>(fixed(8)); }
  std::string str() {
    const uint32_t n = u32();
    if (n > kMaxString) valid_ = false;
    if (!have(n)) return {};
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::vector<std::string> strs() {
    const uint32_t n = u32();
    if (n > kMaxKeys) valid_ = false;
    std::vector<std::string> out;
    for (uint32_t i = 0; i < n && complete_ && valid_; ++i) out.push_back(str());
    return out;
  }
  bool complete() const { return complete_; }
  bool valid() const { return valid_; }
  void invalidate() { valid_ = false; }
  size_t consumed() const { return pos_; }

 private:
  bool have(size_t n) {
    if (complete_ && valid_ && in_.size() - pos_ >= n) return true;
    complete_ = false;
    return false;
  }
  uint64_t fixed(int bytes) {
    if (!have(bytes)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool complete_ = true;
  bool valid_ = true;
};

}  // namespace weft::parallel::tcp_wire
