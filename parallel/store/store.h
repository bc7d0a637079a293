// Store: the small key-value store through which the processes of a job find each other
// (PyTorch's c10d Store).
//
// Every rank of a job holds a client of one store: rank 0 (or the launcher) serves a
// TCPStore on MASTER_ADDR:MASTER_PORT and the others connect to it; tests and jobs on one
// machine can use a FileStore on a shared file instead. The process groups use it to
// rendezvous (who is here, which address each rank listens on), Gloo exchanges its
// connection details through it, and the debug mode compares each collective's fingerprint
// across ranks with it. Values are bytes; add() keeps a decimal integer.
//
// Every wait is bounded: get() and wait() give up after the store's timeout (or the one
// given) with a weft::Error that names the keys still missing, so a rank that never
// arrives makes the others fail with a message instead of hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft::parallel {

using Bytes = std::vector<uint8_t>;

// Text values as the store's bytes, and back.
inline Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string to_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  // PyTorch's default for a process group's rendezvous.
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;

  // Sets (or replaces) the value of `key`.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The value of `key`, waiting up to timeout() for it to be set.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the integer stored at `key` (0 when missing) and returns the result;
  // atomic across every client.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its value is `expected` (a missing key matches an empty
  // `expected`), atomically; returns the value the key holds afterwards.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Whether every key is set now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key is set, up to `timeout`; the error names the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // Removes `key`; returns whether it was there.
  virtual bool delete_key(const std::string& key) = 0;
  // Keys set now.
  virtual int64_t num_keys() = 0;

  // Convenience for text values.
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) { return to_text(get(key)); }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_;
};

// Keys under "<prefix>/": one store shared by several groups or rounds without clashes.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;  // of the whole underlying store
  using Store::set;
  using Store::wait;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace weft::parallel
