// The stores through which a job's processes find each other: TCPStore, FileStore and
// PrefixStore over both, each operation on each, from several threads and several
// fork()ed processes at once; every wait bounded (timeouts name the keys); the TCP
// server's life cycle (clients before the server, a server that goes away, a peer that
// is not a store). Timeouts are short (100-500 ms) to keep the suite fast.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/store/file_store.h"
#include "parallel/store/store.h"
#include "parallel/store/tcp_store.h"

using namespace weft;
using namespace weft::parallel;
using doctest::Contains;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kTimeout{500};

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "weft-store-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// One store of each kind: `store` is the first client (for TCP, the one that runs the
// server), client() makes another client of the same store (also in a fork()ed child).
struct Kind {
  std::string name;
  std::shared_ptr<Store> store;
  std::function<std::shared_ptr<Store>()> client;
};

std::vector<Kind> kinds(const TempDir& dir, milliseconds timeout = kTimeout) {
  auto tcp = std::make_shared<TCPStore>("127.0.0.1", 0, true, timeout);
  const uint16_t port = tcp->port();
  auto tcp_client = [port, timeout]() -> std::shared_ptr<Store> {
    return std::make_shared<TCPStore>("127.0.0.1", port, false, timeout);
  };
  const std::string path = (dir.path / "store").string();
  auto file_client = [path, timeout]() -> std::shared_ptr<Store> { return std::make_shared<FileStore>(path, timeout); };
  auto file = file_client();
  // The prefixed stores share the underlying stores' keys space with nothing else here.
  auto tcp2 = std::make_shared<TCPStore>("127.0.0.1", 0, true, timeout);
  const uint16_t port2 = tcp2->port();
  const std::string path2 = (dir.path / "store2").string();
  return {
      {"TCPStore", tcp, tcp_client},
      {"FileStore", file, file_client},
      {"PrefixStore over TCPStore", std::make_shared<PrefixStore>("group0", tcp2),
       [port2, timeout]() -> std::shared_ptr<Store> {
         return std::make_shared<PrefixStore>("group0", std::make_shared<TCPStore>("127.0.0.1", port2, false, timeout));
       }},
      {"PrefixStore over FileStore", std::make_shared<PrefixStore>("group0", std::make_shared<FileStore>(path2, timeout)),
       [path2, timeout]() -> std::shared_ptr<Store> {
         return std::make_shared<PrefixStore>("group0", std::make_shared<FileStore>(path2, timeout));
       }},
  };
}

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Starts body(i) in `n` fork()ed children; each exits 0 when body returned, 1 when it
// threw. Fork while no other thread of the test uses a store: a child inherits a copy
// of whatever lock another thread held at that moment.
std::vector<pid_t> start_children(int n, const std::function<void(int)>& body) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 0;
      try {
        body(i);
      } catch (...) {
        code = 1;
      }
      ::_exit(code);  // no atexit handlers, no doctest in the child
    }
    pids.push_back(pid);
  }
  return pids;
}

// Reaps the children; returns how many failed. One still running at the deadline is
// killed (and counts as failed): no test waits forever, none leaves a process behind.
int reap_children(const std::vector<pid_t>& pids, milliseconds limit = milliseconds(10000)) {
  int failed = 0;
  const auto deadline = Clock::now() + limit;
  for (pid_t pid : pids) {
    int status = 0;
    pid_t got;
    while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(2));
    if (got == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ++failed;
      continue;
    }
    if (!(got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0)) ++failed;
  }
  return failed;
}

}  // namespace

TEST_CASE("every store: set, get, check, delete_key, num_keys") {
  TempDir dir;
  for (Kind& k : kinds(dir)) {
    INFO(k.name);
    Store& s = *k.store;
    CHECK(s.num_keys() == 0);
    s.set("a", "1");
    CHECK(s.get_string("a") == "1");
    s.set("a", "replaced");
    CHECK(s.get_string("a") == "replaced");
    const Bytes binary = {0, 255, 10, 0, 7, 128};
    s.set("bin", binary);
    CHECK(s.get("bin") == binary);
    s.set("empty", Bytes());
    CHECK(s.get("empty").empty());
    CHECK(s.num_keys() == 3);
    // Another client sees the same keys.
    auto other = k.client();
    CHECK(other->get_string("a") == "replaced");
    CHECK(other->check({"a", "bin", "empty"}));
    CHECK_FALSE(other->check({"a", "missing"}));
    CHECK(other->check({}));
    CHECK(other->delete_key("a"));
    CHECK_FALSE(s.delete_key("a"));
    CHECK_FALSE(s.check({"a"}));
    CHECK(s.num_keys() == 2);
    s.set("a", "back");
    CHECK(other->get_string("a") == "back");
    CHECK(s.num_keys() == 3);
  }
}

TEST_CASE("every store: get and wait return once another thread sets the keys") {
  TempDir dir;
  for (Kind& k : kinds(dir, milliseconds(3000))) {
    INFO(k.name);
    auto other = k.client();
    const auto start = Clock::now();
    std::thread later([&] {
      std::this_thread::sleep_for(milliseconds(60));
      k.store->set("late", "here");  // the store the main thread is waiting on
      std::this_thread::sleep_for(milliseconds(30));
      other->set("x", "1");
      other->set("y", "2");
    });
    CHECK(k.store->get_string("late") == "here");
    CHECK(ms_since(start) >= 50);
    k.store->wait({"late", "x", "y"}, milliseconds(3000));
    CHECK(k.store->get_string("y") == "2");
    CHECK(ms_since(start) < 2000);
    later.join();
  }
}

TEST_CASE("every store: add is exact from several threads and several processes at once") {
  TempDir dir;
  constexpr int kThreads = 4, kProcesses = 3, kAdds = 150;
  for (Kind& k : kinds(dir, milliseconds(5000))) {
    INFO(k.name);
    Store& s = *k.store;
    CHECK(s.add("n", 0) == 0);  // a missing key counts as 0
    CHECK(s.add("n", 5) == 5);
    CHECK(s.add("n", -5) == 0);
    CHECK(s.get_string("n") == "0");  // a decimal integer
    // Child 0 uses the client it inherited (it reconnects or reopens by itself); the
    // others make their own.
    const std::vector<pid_t> children = start_children(kProcesses, [&](int child) {
      std::shared_ptr<Store> mine = child == 0 ? k.store : k.client();
      for (int i = 0; i < kAdds; ++i) mine->add("n", 1);
    });
    std::atomic<int> thread_errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        try {
          // Half the threads share the first client, half have their own.
          std::shared_ptr<Store> mine = t % 2 ? k.client() : k.store;
          for (int i = 0; i < kAdds; ++i) mine->add("n", 1);
        } catch (...) {
          ++thread_errors;
        }
      });
    const int failed = reap_children(children);
    for (auto& t : threads) t.join();
    CHECK(thread_errors == 0);
    CHECK(failed == 0);
    CHECK(s.add("n", 0) == (kThreads + kProcesses) * kAdds);
    CHECK(k.client()->get_string("n") == std::to_string((kThreads + kProcesses) * kAdds));
    s.set("text", "abc");
    CHECK_THROWS_WITH_AS(s.add("text", 1), Contains("not a decimal integer"), Error);
    CHECK(s.add("n", 1) == (kThreads + kProcesses) * kAdds + 1);  // still usable after the error
  }
}

TEST_CASE("every store: compare_set") {
  TempDir dir;
  for (Kind& k : kinds(dir)) {
    INFO(k.name);
    Store& s = *k.store;
    // A missing key matches an empty `expected` only.
    CHECK(s.compare_set("c", b("x"), b("new")).empty());
    CHECK_FALSE(s.check({"c"}));
    CHECK(s.compare_set("c", {}, b("first")) == b("first"));
    CHECK(s.get_string("c") == "first");
    CHECK(s.compare_set("c", b("wrong"), b("second")) == b("first"));  // unchanged
    CHECK(s.compare_set("c", b("first"), b("second")) == b("second"));
    CHECK(s.get_string("c") == "second");
    // Several threads race to claim a key: one wins, all see the winner.
    constexpr int kThreads = 4;
    std::vector<Bytes> seen(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] { seen[t] = k.client()->compare_set("leader", {}, b(std::to_string(t))); });
    for (auto& t : threads) t.join();
    for (int t = 0; t < kThreads; ++t) CHECK(seen[t] == s.get("leader"));
  }
}

TEST_CASE("every store: get of a key never set fails after the timeout, naming the key") {
  TempDir dir;
  for (Kind& k : kinds(dir, milliseconds(150))) {
    INFO(k.name);
    const auto start = Clock::now();
    std::string what;
    try {
      k.store->get("never-set");
    } catch (const Error& e) {
      what = e.what();
    }
    const int64_t took = ms_since(start);
    CHECK_MESSAGE(what.find("never-set'") != std::string::npos, what);
    CHECK_MESSAGE(what.find("150 ms") != std::string::npos, what);
    CHECK(took >= 145);
    CHECK(took < 550);
    // A timeout set on the store afterwards is the one get() uses.
    k.store->set_timeout(milliseconds(50));
    const auto again = Clock::now();
    CHECK_THROWS_WITH_AS(k.store->get("never-set"), Contains("50 ms"), Error);
    CHECK(ms_since(again) < 450);
    k.store->set("k", "v");  // and the store still works after its timeouts
    CHECK(k.store->get_string("k") == "v");
  }
}

TEST_CASE("every store: wait with a timeout names the keys still missing") {
  TempDir dir;
  for (Kind& k : kinds(dir)) {
    INFO(k.name);
    k.store->set("here", "1");
    const auto start = Clock::now();
    try {
      k.store->wait({"here", "gone1", "gone2"}, milliseconds(150));
      FAIL("wait returned with keys missing");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find("gone1") != std::string::npos, what);
      CHECK_MESSAGE(what.find("gone2") != std::string::npos, what);
      CHECK_MESSAGE(what.find("'here'") == std::string::npos, what);  // it was there
      CHECK_MESSAGE(what.find("150 ms") != std::string::npos, what);
    }
    const int64_t took = ms_since(start);
    CHECK(took >= 145);
    CHECK(took < 550);
    k.store->wait({"here"}, milliseconds(0));  // no waiting needed
    CHECK_THROWS_AS(k.store->wait({"gone1"}, milliseconds(0)), Error);
  }
}

TEST_CASE("PrefixStore: keys live under <prefix>/, separate from other prefixes") {
  TempDir dir;
  auto base = std::make_shared<FileStore>((dir.path / "base").string(), kTimeout);
  PrefixStore a("a", base), b2("b", base);
  a.set("k", "from a");
  b2.set("k", "from b");
  CHECK(base->get_string("a/k") == "from a");
  CHECK(base->get_string("b/k") == "from b");
  CHECK(a.get_string("k") == "from a");
  CHECK(a.num_keys() == 2);  // of the whole underlying store
  CHECK(a.add("count", 2) == 2);
  CHECK(base->get_string("a/count") == "2");
  CHECK(a.delete_key("k"));
  CHECK_FALSE(base->check({"a/k"}));
  CHECK(b2.check({"k"}));
  CHECK_THROWS_WITH_AS(a.wait({"missing"}, milliseconds(50)), Contains("a/missing"), Error);
  CHECK_THROWS_WITH_AS(PrefixStore("p", nullptr), Contains("null"), Error);
}

// ---- TCPStore -------------------------------------------------------------------------

TEST_CASE("TCPStore: port 0 gives a usable ephemeral port") {
  TCPStore server("127.0.0.1", 0, true, kTimeout);
  TCPStore other_server("127.0.0.1", 0, true, kTimeout);
  CHECK(server.is_server());
  CHECK(server.port() != 0);
  CHECK(other_server.port() != server.port());
  TCPStore client("127.0.0.1", server.port(), false, kTimeout);
  CHECK_FALSE(client.is_server());
  client.set("k", "v");
  CHECK(server.get_string("k") == "v");
  CHECK_FALSE(other_server.check({"k"}));
  // Every interface; the owner's client then connects over loopback.
  TCPStore any("0.0.0.0", 0, true, kTimeout);
  TCPStore any_client("127.0.0.1", any.port(), false, kTimeout);
  any_client.set("x", "1");
  CHECK(any.get_string("x") == "1");
  // A port in use is an error naming it.
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", server.port(), true, kTimeout),
                       Contains(("127.0.0.1:" + std::to_string(server.port())).c_str()), Error);
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", 0, false, kTimeout), Contains("port 0"), Error);
}

TEST_CASE("TCPStore: a client started before its server connects once the server appears") {
  uint16_t port;
  {
    TCPStore probe("127.0.0.1", 0, true, kTimeout);  // a port that is free once probe is gone
    port = probe.port();
  }
  std::unique_ptr<TCPStore> early;
  std::string error;
  std::thread client([&] {
    try {
      early = std::make_unique<TCPStore>("127.0.0.1", port, false, milliseconds(3000));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(150));
  TCPStore server("127.0.0.1", port, true, kTimeout);
  client.join();
  REQUIRE_MESSAGE(early, error);
  early->set("from-early", "yes");
  CHECK(server.get_string("from-early") == "yes");
}

TEST_CASE("TCPStore: connecting where no server appears fails after the timeout, naming host:port") {
  uint16_t port;
  {
    TCPStore probe("127.0.0.1", 0, true, kTimeout);
    port = probe.port();
  }
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", port, false, milliseconds(200)),
                       Contains(("127.0.0.1:" + std::to_string(port)).c_str()), Error);
  const int64_t took = ms_since(start);
  CHECK(took >= 150);
  CHECK(took < 700);
  CHECK_THROWS_WITH_AS(TCPStore("no-such-host.invalid", 1234, false, milliseconds(50)), Contains("no-such-host.invalid:1234"),
                       Error);
}

TEST_CASE("TCPStore: a peer that accepts but never answers is an error after the timeout, not a hang") {
  // A listening socket nobody accepts on: the kernel completes the connection, nothing replies.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", ntohs(addr.sin_port), false, milliseconds(200)), Contains("no greeting"),
                       Error);
  CHECK(ms_since(start) < 700);
  ::close(fd);
}

TEST_CASE("TCPStore: one client waiting does not hold up the others") {
  TCPStore server("127.0.0.1", 0, true, milliseconds(3000));
  TCPStore waiter("127.0.0.1", server.port(), false, milliseconds(3000));
  std::atomic<bool> got{false};
  std::thread blocked([&] {
    CHECK(waiter.get_string("go") == "now");
    got = true;
  });
  const auto start = Clock::now();
  TCPStore busy("127.0.0.1", server.port(), false, kTimeout);
  for (int i = 0; i < 200; ++i) {
    busy.set("k" + std::to_string(i), std::to_string(i));
    CHECK(busy.get_string("k" + std::to_string(i)) == std::to_string(i));
  }
  CHECK_FALSE(got);
  CHECK(ms_since(start) < 2000);
  busy.set("go", "now");
  blocked.join();
  CHECK(got);
  // Many clients, each waiting for the keys of all: a rendezvous.
  constexpr int kClients = 16;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back("rank" + std::to_string(i));
  std::atomic<int> done{0}, errors{0};
  std::vector<std::thread> ranks;
  for (int i = 0; i < kClients; ++i)
    ranks.emplace_back([&, i] {
      try {
        TCPStore me("127.0.0.1", server.port(), false, milliseconds(3000));
        me.set(keys[i], std::to_string(i));
        me.wait(keys);
        ++done;
      } catch (...) {
        ++errors;
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(done == kClients);
  CHECK(errors == 0);
}

TEST_CASE("TCPStore: clients of a server that went away get an error, and the server stops promptly") {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, true, kTimeout);
  TCPStore idle("127.0.0.1", server->port(), false, kTimeout);
  TCPStore busy("127.0.0.1", server->port(), false, milliseconds(5000));
  idle.set("k", "v");
  std::string waiting_error;
  int64_t waited = -1;
  std::thread waiting([&] {
    const auto start = Clock::now();
    try {
      busy.get("never-set");  // pending on the server when it goes away
    } catch (const Error& e) {
      waiting_error = e.what();
    }
    waited = ms_since(start);
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  server.reset();  // with two clients connected, one of them waiting
  CHECK(ms_since(start) < 300);
  waiting.join();
  CHECK_MESSAGE(waiting_error.find("closed the connection") != std::string::npos, waiting_error);
  CHECK(waited < 1000);
  CHECK_THROWS_WITH_AS(idle.get("k"), Contains("127.0.0.1"), Error);
  CHECK_THROWS_WITH_AS(idle.set("k", "v"), Contains("failed earlier"), Error);
  // Sending a large value to a peer that is gone: EPIPE, not a SIGPIPE that kills us.
  TCPStore server2("127.0.0.1", 0, true, kTimeout);
  auto doomed = std::make_unique<TCPStore>("127.0.0.1", server2.port(), false, kTimeout);
  auto server3 = std::make_unique<TCPStore>("127.0.0.1", 0, true, kTimeout);
  TCPStore orphan("127.0.0.1", server3->port(), false, kTimeout);
  server3.reset();
  std::this_thread::sleep_for(milliseconds(20));
  CHECK_THROWS_AS(orphan.set("big", Bytes(16 << 20, 1)), Error);
  CHECK_THROWS_AS(orphan.set("big", Bytes(16 << 20, 1)), Error);
  doomed->set("still", "alive");
  CHECK(server2.get_string("still") == "alive");
}

TEST_CASE("TCPStore: a fork()ed child uses and destroys its copy of the server's owner; the parent's server lives on") {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, true, kTimeout);
  server->set("before", "1");
  const std::vector<pid_t> child = start_children(1, [&](int) {
    if (server->get_string("before") != "1") throw std::runtime_error("wrong value");
    server->set("from-child", "1");
    server.reset();  // no server thread to stop here
  });
  CHECK(reap_children(child) == 0);
  CHECK(server->get_string("from-child") == "1");
  TCPStore client("127.0.0.1", server->port(), false, kTimeout);
  client.set("after", "2");
  CHECK(server->get_string("after") == "2");
}

TEST_CASE("TCPStore: a peer sending garbage loses its connection; the server carries on") {
  TCPStore server("127.0.0.1", 0, true, kTimeout);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(server.port());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  REQUIRE(::send(fd, junk, sizeof junk, MSG_NOSIGNAL) > 0);
  char buf[16];
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  CHECK(::recv(fd, buf, sizeof buf, 0) == 0);  // closed by the server
  ::close(fd);
  server.set("k", "v");
  CHECK(server.get_string("k") == "v");
}

// ---- FileStore ------------------------------------------------------------------------

TEST_CASE("FileStore: an unusable path is an error naming it") {
  TempDir dir;
  const std::string missing_dir = (dir.path / "no-such-dir" / "store").string();
  CHECK_THROWS_WITH_AS(FileStore(missing_dir, kTimeout), Contains(missing_dir.c_str()), Error);
  CHECK_THROWS_WITH_AS(FileStore(missing_dir, kTimeout), Contains("No such file or directory"), Error);
  CHECK_THROWS_WITH_AS(FileStore(dir.path.string(), kTimeout), Contains(dir.path.string().c_str()), Error);  // a directory
  const std::string other = (dir.path / "other").string();
  std::ofstream(other) << "some other file's content\n";
  CHECK_THROWS_WITH_AS(FileStore(other, kTimeout), Contains("not a weft FileStore"), Error);
  if (::geteuid() != 0) {  // root may write anywhere
    const std::filesystem::path locked = dir.path / "locked";
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    CHECK_THROWS_WITH_AS(FileStore((locked / "store").string(), kTimeout), Contains("Permission denied"), Error);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }
}

TEST_CASE("FileStore: a record half-written by a process that died is cut off by the next writer") {
  TempDir dir;
  const std::string path = (dir.path / "store").string();
  {
    FileStore s(path, kTimeout);
    s.set("a", "1");
  }
  {
    std::ofstream torn(path, std::ios::app | std::ios::binary);
    const char record[] = {'S', 5, 0, 0, 0, 'a', 'b'};  // a key of 5 bytes, 2 of them written
    torn.write(record, sizeof record);
  }
  FileStore s(path, kTimeout);
  CHECK(s.get_string("a") == "1");
  CHECK(s.num_keys() == 1);
  s.set("b", "2");
  FileStore fresh(path, kTimeout);
  CHECK(fresh.get_string("a") == "1");
  CHECK(fresh.get_string("b") == "2");
  CHECK(fresh.num_keys() == 2);
  CHECK(fresh.path() == path);
}
