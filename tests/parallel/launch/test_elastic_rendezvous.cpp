// ElasticRendezvous: agents as threads over one TCPStore (an ephemeral port on loopback).
// Rounds close at max or after the last call, late agents wait and join the next round,
// below min is an error naming who came, heartbeats find a silent agent, the first end
// of a round wins, and a finished job releases the agents that wait. Then the workers'
// side: the variables an agent gives them, read back (train/elastic.h).
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <thread>

#include "parallel/launch/elastic_rendezvous.h"
#include "parallel/store/tcp_store.h"
#include "train/elastic.h"

using namespace weft::parallel;
using namespace std::chrono_literals;

namespace {

struct Job {
  std::shared_ptr<TCPStore> server = std::make_shared<TCPStore>("127.0.0.1", 0, true, 10s);

  // An agent's own connection, with the job's keys at its root.
  ElasticRendezvous agent(const std::string& id, RendezvousOptions o, int nproc = 1) {
    auto client = std::make_shared<TCPStore>("127.0.0.1", server->port(), false, 10s);
    return ElasticRendezvous(std::make_shared<PrefixStore>("rdzv/job", client), NodeInfo{id, nproc, "127.0.0.1"}, o);
  }
};

RendezvousOptions fast(int min_nodes, int max_nodes) {
  RendezvousOptions o;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.join_timeout = 5s;
  o.last_call_timeout = 200ms;
  o.keep_alive_interval = 50ms;
  o.heartbeat_timeout = 500ms;
  o.poll_interval = 10ms;
  return o;
}

std::vector<std::string> ids(const RendezvousRound& r) {
  std::vector<std::string> out;
  for (const NodeInfo& n : r.members) out.push_back(n.id);
  return out;
}

}  // namespace

TEST_CASE("a round closes at max nodes at once; node ranks follow join order; ranks follow nproc") {
  Job job;
  RendezvousOptions o = fast(1, 3);
  o.last_call_timeout = 60s;  // only reaching max can close the round in time
  auto a = job.agent("a", o, 2), b = job.agent("b", o, 1), c = job.agent("c", o, 3);
  auto ra = std::async(std::launch::async, [&] { return a.next_round(); });
  std::this_thread::sleep_for(50ms);
  auto rb = std::async(std::launch::async, [&] { return b.next_round(); });
  std::this_thread::sleep_for(50ms);
  auto rc = std::async(std::launch::async, [&] { return c.next_round(); });
  const auto x = ra.get().value(), y = rb.get().value(), z = rc.get().value();
  CHECK(ids(x) == std::vector<std::string>{"a", "b", "c"});
  CHECK(ids(y) == ids(x));
  CHECK(ids(z) == ids(x));
  CHECK(x.number == 0);
  CHECK(x.node_rank == 0);
  CHECK(y.node_rank == 1);
  CHECK(z.node_rank == 2);
  CHECK(x.world_size() == 6);
  CHECK(z.first_rank(2) == 3);
}

TEST_CASE("min nodes close after the last call; a late agent waits and joins the next round") {
  Job job;
  auto a = job.agent("a", fast(2, 3)), b = job.agent("b", fast(2, 3)), late = job.agent("late", fast(2, 3));
  auto ra = std::async(std::launch::async, [&] { return a.next_round(); });
  auto rb = std::async(std::launch::async, [&] { return b.next_round(); });
  const RendezvousRound x = ra.get().value(), y = rb.get().value();
  CHECK(x.num_nodes() == 2);
  CHECK(y.num_nodes() == 2);
  CHECK(x.node_rank != y.node_rank);

  auto rl = std::async(std::launch::async, [&] { return late.next_round(); });
  for (int i = 0; i < 200 && a.waiting(0) == 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(a.waiting(0) == 1);
  // Workers that do not admit at checkpoints: the watch ends the round for the waiting agent.
  const std::string why = a.watch(x);
  CHECK(why.find("1 node waits to join") != std::string::npos);
  CHECK(a.end_reason(0) == why);
  CHECK_FALSE(a.ended_by_failure(0));  // admitting is not a failure

  auto ra1 = std::async(std::launch::async, [&] { return a.next_round(); });
  auto rb1 = std::async(std::launch::async, [&] { return b.next_round(); });
  const RendezvousRound l = rl.get().value(), a1 = ra1.get().value();
  CHECK(rb1.get().value().number == 1);
  CHECK(l.number == 1);
  CHECK(l.num_nodes() == 3);  // max: closed at once
  CHECK(ids(a1) == ids(l));
}

TEST_CASE("when the workers admit at checkpoints, the watch leaves a waiting agent to them") {
  Job job;
  auto a = job.agent("a", fast(1, 2)), late = job.agent("late", fast(1, 2));
  const RendezvousRound x = a.next_round().value();
  ElasticJob(std::make_shared<PrefixStore>("rdzv/job", job.server)).admit_at_checkpoints(0);
  auto rl = std::async(std::launch::async, [&] { return late.next_round(); });
  for (int i = 0; i < 200 && a.waiting(0) == 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(a.watch(x).empty());
  a.end_round(0, "admitting at the checkpoint of step 3", false);
  CHECK(a.next_round().value().num_nodes() == 2);
  CHECK(rl.get().value().number == 1);
}

TEST_CASE("below min nodes for join_timeout: an error naming who came and how many are missing") {
  Job job;
  RendezvousOptions patient = fast(3, 4), impatient = fast(3, 4);
  patient.join_timeout = 1s;
  impatient.join_timeout = 300ms;
  auto a = job.agent("alpha", impatient), b = job.agent("beta", patient);
  auto rb = std::async(std::launch::async, [&] { return b.next_round(); });
  for (int i = 0; i < 200 && b.store().add(ElasticJob::round_key(0, "joined"), 0) == 0; ++i)
    std::this_thread::sleep_for(10ms);
  const auto start = std::chrono::steady_clock::now();
  try {
    a.next_round();
    FAIL("next_round returned below min nodes");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    CHECK(what.find("waited 0.3 s (join_timeout) for at least 3 nodes in round 0") != std::string::npos);
    CHECK(what.find("only 2 joined (beta, alpha); 1 more must start weft-run") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  // alpha gave up and withdrew: round 0 started over as round 1, where beta waits alone.
  CHECK(b.end_reason(0).value().find("node alpha gave up waiting for 3 nodes") != std::string::npos);
  try {
    rb.get();
    FAIL("beta's next_round returned below min nodes");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("in round 1, but only 1 joined (beta); 2 more") != std::string::npos);
  }
}

TEST_CASE("a member whose heartbeat stops is found within heartbeat_timeout; the round ends as a failure") {
  Job job;
  auto a = job.agent("a", fast(2, 2)), b = job.agent("b", fast(2, 2));
  auto rb = std::async(std::launch::async, [&] { return b.next_round(); });
  const RendezvousRound x = a.next_round().value();
  rb.get();
  // b goes silent: only a watches.
  const auto start = std::chrono::steady_clock::now();
  std::string why;
  while (why.empty() && std::chrono::steady_clock::now() - start < 5s) {
    why = a.watch(x);
    std::this_thread::sleep_for(20ms);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(why.find("(b, 127.0.0.1) sent no heartbeat for 0.5 s") != std::string::npos);
  CHECK(took >= 500ms);
  CHECK(took < 2s);
  CHECK(a.ended_by_failure(0));
  // The next round: an agent whose min is 1 closes it alone after the last call.
  auto solo = job.agent("a", fast(1, 2));
  const RendezvousRound y = solo.next_round().value();
  CHECK(y.number == 1);
  CHECK(ids(y) == std::vector<std::string>{"a"});
}

TEST_CASE("heartbeats keep a watched round going") {
  Job job;
  auto a = job.agent("a", fast(2, 2)), b = job.agent("b", fast(2, 2));
  auto rb = std::async(std::launch::async, [&] { return b.next_round(); });
  const RendezvousRound x = a.next_round().value();
  const RendezvousRound y = rb.get().value();
  const auto until = std::chrono::steady_clock::now() + 1500ms;  // three heartbeat timeouts
  while (std::chrono::steady_clock::now() < until) {
    REQUIRE(a.watch(x).empty());
    REQUIRE(b.watch(y).empty());
    std::this_thread::sleep_for(20ms);
  }
}

TEST_CASE("the first end of a round stands, failure or not; everyone moves to the next round") {
  Job job;
  auto a = job.agent("a", fast(1, 1));
  const RendezvousRound x = a.next_round().value();
  CHECK(a.end_round(x.number, "rank 0 exited with status 3", true) == "rank 0 exited with status 3");
  CHECK(a.end_round(x.number, "node 1 left", false) == "rank 0 exited with status 3");
  CHECK(a.ended_by_failure(x.number));
  CHECK(a.watch(x) == "rank 0 exited with status 3");
  const RendezvousRound y = a.next_round().value();
  CHECK(y.number == 1);
  a.end_round(y.number, "node 1 left", false);
  CHECK_FALSE(a.ended_by_failure(y.number));
  CHECK(a.end_reason(y.number) == "node 1 left");
}

TEST_CASE("a finished job releases an agent waiting to join; the serving agent waits for the others to leave") {
  Job job;
  auto a = job.agent("a", fast(1, 1)), late = job.agent("late", fast(1, 1));
  const RendezvousRound x = a.next_round().value();
  auto rl = std::async(std::launch::async, [&] { return late.next_round(); });
  for (int i = 0; i < 200 && a.waiting(0) == 0; ++i) std::this_thread::sleep_for(10ms);
  a.finish_job(x.number);
  CHECK_FALSE(rl.get().has_value());
  a.leave(x.number);
  const auto start = std::chrono::steady_clock::now();
  a.wait_for_others_to_leave(x);  // a and the waiting agent have left: no wait
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  int64_t watched = -1;
  CHECK_FALSE(a.job_alive(watched));  // done
}

TEST_CASE("after the job is done, silence is no failure; the serving agent waits for the others to leave") {
  Job job;
  auto a = job.agent("a", fast(2, 2)), b = job.agent("b", fast(2, 2));
  auto rb = std::async(std::launch::async, [&] { return b.next_round(); });
  const RendezvousRound x = a.next_round().value();
  rb.get();
  b.finish_job(x.number);  // b's workers are done; b leaves and its heartbeats stop
  b.leave(x.number);
  const auto until = std::chrono::steady_clock::now() + 1s;  // two heartbeat timeouts
  while (std::chrono::steady_clock::now() < until) {
    REQUIRE(a.watch(x).empty());
    std::this_thread::sleep_for(20ms);
  }
  a.leave(x.number);
  a.wait_for_others_to_leave(x);  // both left
}

TEST_CASE("an agent stopped during the rendezvous withdraws: the round starts over without it") {
  Job job;
  RendezvousOptions o = fast(2, 3);
  std::atomic<bool> stop{false};
  o.interrupted = [&] { return stop.load(); };
  auto quitter = job.agent("quitter", o), stayer = job.agent("stayer", fast(1, 3));
  auto rq = std::async(std::launch::async, [&] { return quitter.next_round(); });
  for (int i = 0; i < 200 && stayer.store().add(ElasticJob::round_key(0, "joined"), 0) == 0; ++i)
    std::this_thread::sleep_for(10ms);
  stop = true;
  CHECK_THROWS_AS(rq.get(), RendezvousInterrupted);
  CHECK(stayer.end_reason(0).value().find("node quitter was stopped during the rendezvous") != std::string::npos);
  CHECK_FALSE(stayer.ended_by_failure(0));
  const RendezvousRound y = stayer.next_round().value();
  CHECK(y.number == 1);
  CHECK(ids(y) == std::vector<std::string>{"stayer"});
}

TEST_CASE("an agent waiting behind a round whose members all went silent ends it, then joins the next") {
  Job job;
  auto a = job.agent("a", fast(1, 1)), late = job.agent("late", fast(1, 1));
  const RendezvousRound x = a.next_round().value();  // a runs round 0, then goes silent
  const auto start = std::chrono::steady_clock::now();
  const RendezvousRound y = late.next_round().value();
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(y.number == 1);
  CHECK(ids(y) == std::vector<std::string>{"late"});
  CHECK(late.end_reason(x.number).value().find("(a, 127.0.0.1) sent no heartbeat") != std::string::npos);
  CHECK(late.ended_by_failure(x.number));
}

TEST_CASE("an interrupted wait throws RendezvousInterrupted; bad settings are refused") {
  Job job;
  RendezvousOptions o = fast(2, 2);
  std::atomic<bool> stop{false};
  o.interrupted = [&] { return stop.load(); };
  auto a = job.agent("a", o);
  auto ra = std::async(std::launch::async, [&] { return a.next_round(); });
  std::this_thread::sleep_for(50ms);
  stop = true;
  CHECK_THROWS_AS(ra.get(), RendezvousInterrupted);
  CHECK_THROWS_WITH(job.agent("x", fast(3, 2)), doctest::Contains("not a range MIN:MAX"));
  CHECK_THROWS_WITH(job.agent("a/b", fast(1, 2)), doctest::Contains("without '/'"));
  CHECK(NodeInfo::decode(NodeInfo{"n1", 4, "host"}.encode()).nproc == 4);
  CHECK_THROWS_WITH(NodeInfo::decode("n1 zero host"), doctest::Contains("malformed node entry"));
}

TEST_CASE("a worker reads its agent's variables; a missing or malformed one is named") {
  struct Var {
    const char* name;
    const char* value;
  };
  const Var vars[] = {{"WEFT_ELASTIC", "1"},       {"WEFT_RUN_ID", "job7"},   {"WEFT_ROUND", "3"},
                      {"GROUP_WORLD_SIZE", "2"},   {"WEFT_MIN_NODES", "1"},   {"WEFT_MAX_NODES", "4"},
                      {"WEFT_RESTART_COUNT", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}};
  for (const Var& v : vars) setenv(v.name, v.value, 1);
  const weft::train::ElasticEnv e = weft::train::read_elastic_env().value();
  CHECK(e.run_id == "job7");
  CHECK(e.round == 3);
  CHECK(e.num_nodes == 2);
  CHECK(e.max_nodes == 4);
  CHECK(e.restart_count == 1);
  CHECK(e.store_host == "node0");
  CHECK(e.store_port == 29400);
  setenv("MASTER_PORT", "70000", 1);
  CHECK_THROWS_WITH(weft::train::read_elastic_env(), doctest::Contains("MASTER_PORT='70000' is not an integer in [1"));
  unsetenv("WEFT_ROUND");
  CHECK_THROWS_WITH(weft::train::read_elastic_env(), doctest::Contains("WEFT_ROUND is not set"));
  unsetenv("WEFT_RUN_ID");  // WEFT_ELASTIC=1 by hand: resumes as an elastic worker, no rendezvous
  CHECK_FALSE(weft::train::read_elastic_env().has_value());
  setenv("WEFT_ELASTIC", "yes", 1);
  CHECK_THROWS_WITH(weft::train::read_elastic_env(), doctest::Contains("WEFT_ELASTIC must be 1"));
  for (const Var& v : vars) unsetenv(v.name);
  CHECK_FALSE(weft::train::read_elastic_env().has_value());
}
