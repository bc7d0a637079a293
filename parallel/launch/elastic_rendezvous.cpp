// ElasticRendezvous: joining, closing and ending rounds; see Note [Elastic rounds].
#include "parallel/launch/elastic_rendezvous.h"

#include <charconv>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace weft::parallel {

namespace {

using Clock = std::chrono::steady_clock;

int64_t parse_count(const std::string& value, const std::string& key) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  WEFT_CHECK(ec == std::errc() && end == value.data() + value.size() && n >= 0, "rendezvous: key '", key,
             "' holds '", value, "', not a count (is another program using this store?)");
  return n;
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

}  // namespace

std::string NodeInfo::encode() const { return id + " " + std::to_string(nproc) + " " + host; }

NodeInfo NodeInfo::decode(const std::string& text) {
  std::istringstream in(text);
  NodeInfo n;
  WEFT_CHECK(in >> n.id >> n.nproc >> n.host && n.nproc >= 1, "rendezvous: malformed node entry '", text, "'");
  return n;
}

int RendezvousRound::world_size() const { return first_rank(num_nodes()); }

int RendezvousRound::first_rank(int node_rank) const {
  int rank = 0;
  for (int i = 0; i < node_rank; ++i) rank += members[static_cast<size_t>(i)].nproc;
  return rank;
}

ElasticJob::ElasticJob(std::shared_ptr<Store> store) : store_(std::move(store)) {
  WEFT_CHECK(store_ != nullptr, "ElasticJob: no store");
}

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<Store> store, NodeInfo me, RendezvousOptions options)
    : ElasticJob(std::move(store)), me_(std::move(me)), options_(options) {
  WEFT_CHECK(options_.min_nodes >= 1 && options_.min_nodes <= options_.max_nodes, "rendezvous: nodes ",
             options_.min_nodes, ":", options_.max_nodes, " is not a range MIN:MAX with 1 <= MIN <= MAX");
  WEFT_CHECK(me_.id.find_first_of(" /") == std::string::npos && !me_.id.empty(), "rendezvous: node id '", me_.id,
             "' must be a non-empty word without '/'");
}

std::string ElasticJob::round_key(int64_t number, const std::string& name) {
  std::string key = "r";  // appended piece by piece: GCC 12 warns (-Wrestrict) about "r" + ... + name
  key += std::to_string(number);
  key += '/';
  key += name;
  return key;
}

std::optional<std::string> ElasticJob::get_if_set(const std::string& key) {
  if (!store_->check({key})) return std::nullopt;
  return to_text(store_->get(key));
}

std::optional<int> ElasticJob::closed_members(int64_t number) {
  const std::string key = round_key(number, "closed");
  const std::optional<std::string> closed = get_if_set(key);
  if (!closed) return std::nullopt;
  return static_cast<int>(parse_count(*closed, key));
}

void ElasticJob::advance_round(int64_t from) {
  store_->compare_set("round", to_bytes(std::to_string(from)), to_bytes(std::to_string(from + 1)));
}

int64_t ElasticJob::waiting(int64_t number) { return store_->add(round_key(number, "waiting"), 0); }

std::optional<std::string> ElasticJob::end_entry(int64_t number) {
  std::optional<std::string> entry = get_if_set(round_key(number, "end"));
  WEFT_CHECK(!entry || (entry->size() >= 2 && ((*entry)[0] == 'F' || (*entry)[0] == 'M') && (*entry)[1] == ' '),
             "rendezvous: key '", round_key(number, "end"), "' holds '", *entry, "', not a round's end");
  return entry;
}

std::optional<std::string> ElasticJob::end_reason(int64_t number) {
  std::optional<std::string> entry = end_entry(number);
  if (!entry) return std::nullopt;
  return entry->substr(2);
}

bool ElasticJob::ended_by_failure(int64_t number) {
  std::optional<std::string> entry = end_entry(number);
  return entry && (*entry)[0] == 'F';
}

void ElasticJob::admit_at_checkpoints(int64_t number) {
  store_->set(round_key(number, "admits_at_checkpoints"), std::string("1"));
}

std::string ElasticJob::end_round(int64_t number, const std::string& reason, bool failure) {
  const std::string entry = (failure ? "F " : "M ") + reason;
  const std::string stands = to_text(store_->compare_set(round_key(number, "end"), {}, to_bytes(entry)));
  advance_round(number);
  return stands.substr(std::min<size_t>(2, stands.size()));
}

int64_t ElasticRendezvous::current_round() { return store_->add("round", 0); }

void ElasticRendezvous::pause() {
  if (options_.interrupted && options_.interrupted()) throw RendezvousInterrupted();
  std::this_thread::sleep_for(options_.poll_interval);
}

void ElasticRendezvous::heartbeat() {
  const auto now = Clock::now();
  if (now < next_heartbeat_) return;
  store_->add("alive/" + me_.id, 1);
  next_heartbeat_ = now + options_.keep_alive_interval;
}

std::optional<RendezvousRound> ElasticRendezvous::next_round() {
  int64_t behind = -1;                     // the running round this agent waits behind
  std::optional<RendezvousRound> running;  // its members, whose heartbeats it watches
  try {
    for (;;) {
      heartbeat();
      if (job_done()) return std::nullopt;
      const int64_t number = current_round();
      if (!store_->check({round_key(number, "closed")})) {
        if (auto round = join(number)) return round;
        continue;  // too late for that round, or it started over: look again
      }
      // Round `number` runs without this agent. An ended round is being moved on: help it.
      if (end_reason(number)) {
        advance_round(number);
      } else if (behind != number) {
        store_->add(round_key(number, "waiting"), 1);
        behind = number;
        running = read_round(number, closed_members(number).value(), -1);
      } else if (running) {
        // Should every member die at once, nobody would be left to end the round: the
        // agents waiting behind it watch the members' heartbeats as the members do.
        if (std::optional<std::string> silent = silent_member(*running)) end_round(number, *silent, true);
      }
      pause();
    }
  } catch (const RendezvousInterrupted&) {
    if (behind >= 0 && !end_reason(behind)) store_->add(round_key(behind, "waiting"), -1);
    throw;
  }
}

// Joins round `number`; returns it once closed, or nullopt when it closed without this
// agent (it came too late), started over (a member withdrew) or the job finished.
std::optional<RendezvousRound> ElasticRendezvous::join(int64_t number) {
  const auto deadline = Clock::now() + options_.join_timeout;
  const int slot = static_cast<int>(store_->add(round_key(number, "joined"), 1) - 1);
  store_->set(round_key(number, "node/" + std::to_string(slot)), me_.encode());
  int64_t last_count = -1;
  auto last_call_at = Clock::time_point::max();
  try {
    for (;;) {
      heartbeat();
      if (end_reason(number)) return std::nullopt;  // it starts over as the next round
      if (const std::optional<int> members = closed_members(number)) {
        if (slot >= *members) return std::nullopt;
        return read_round(number, *members, slot);
      }
      if (store_->check({"done"})) return std::nullopt;  // next_round() leaves
      const int64_t count = store_->add(round_key(number, "joined"), 0);
      const auto now = Clock::now();
      if (count != last_count) {  // someone joined: the last call starts again
        last_count = count;
        last_call_at = now + options_.last_call_timeout;
      }
      int64_t close_at = 0;
      if (count >= options_.max_nodes) close_at = options_.max_nodes;
      else if (count >= options_.min_nodes && now >= last_call_at) close_at = count;
      if (close_at > 0) {
        store_->compare_set(round_key(number, "closed"), {}, to_bytes(std::to_string(close_at)));
        continue;  // read back whichever count won
      }
      if (count < options_.min_nodes && now >= deadline) {
        const std::string message = below_min_message(number);
        withdraw(number, "gave up waiting for " + std::to_string(options_.min_nodes) + " nodes");
        WEFT_FAIL(message);
      }
      pause();
    }
  } catch (const RendezvousInterrupted&) {
    withdraw(number, "was stopped");
    throw;
  }
}

// This agent's slot in the unclosed round `number` will never run: the round starts over
// (as number + 1) without it, rather than closing with a member that is gone.
void ElasticRendezvous::withdraw(int64_t number, const std::string& why) {
  end_round(number, "node " + me_.id + " " + why + " during the rendezvous", /*failure=*/false);
}

std::string ElasticRendezvous::below_min_message(int64_t number) {
  const int64_t count = store_->add(round_key(number, "joined"), 0);
  std::string present;
  for (int64_t k = 0; k < count; ++k)
    if (auto node = get_if_set(round_key(number, "node/" + std::to_string(k))))
      present += (present.empty() ? "" : ", ") + NodeInfo::decode(*node).id;
  std::ostringstream out;
  out << "rendezvous: waited " << seconds(options_.join_timeout) << " s (join_timeout) for at least "
      << options_.min_nodes << " node" << (options_.min_nodes == 1 ? "" : "s") << " in round " << number
      << ", but only " << count << " joined (" << present << "); " << options_.min_nodes - count
      << " more must start weft-run with the same --rdzv-endpoint and --rdzv-id";
  return out.str();
}

std::optional<RendezvousRound> ElasticRendezvous::read_round(int64_t number, int members, int slot) {
  RendezvousRound round;
  round.number = number;
  round.node_rank = slot;
  std::vector<std::string> keys;
  for (int k = 0; k < members; ++k) keys.push_back(round_key(number, "node/" + std::to_string(k)));
  // A slot's entry follows its join by one request: a bounded wait covers an agent that
  // died in between, and the round then starts over without it.
  const auto until = Clock::now() + std::max(options_.heartbeat_timeout, std::chrono::milliseconds(1000));
  while (!store_->check(keys)) {
    if (Clock::now() >= until) {
      end_round(number, "a node that joined round " + std::to_string(number) + " never said who it is",
                /*failure=*/false);
      return std::nullopt;
    }
    std::this_thread::sleep_for(options_.poll_interval);
  }
  for (const std::string& key : keys) round.members.push_back(NodeInfo::decode(to_text(store_->get(key))));
  return round;
}

std::optional<std::string> ElasticRendezvous::silent_member(const RendezvousRound& round) {
  const auto now = Clock::now();
  if (watched_round_ != round.number) {
    watched_round_ = round.number;
    seen_.assign(round.members.size(), Seen{-1, now});
  }
  for (size_t i = 0; i < round.members.size(); ++i) {
    const NodeInfo& peer = round.members[i];
    if (peer.id == me_.id) continue;
    const int64_t count = store_->add("alive/" + peer.id, 0);
    if (count != seen_[i].count) {
      seen_[i] = Seen{count, now};
    } else if (now - seen_[i].since >= options_.heartbeat_timeout) {
      std::ostringstream reason;
      reason << "node " << i << " (" << peer.id << ", " << peer.host << ") sent no heartbeat for "
             << seconds(options_.heartbeat_timeout) << " s";
      return reason.str();
    }
  }
  return std::nullopt;
}

std::string ElasticRendezvous::watch(const RendezvousRound& round) {
  heartbeat();
  if (auto reason = end_reason(round.number)) return *reason;
  // A finished job's agents leave and stop their heartbeats while others may still be
  // writing their last files: silence is no failure any more.
  if (store_->check({"done"})) return "";
  if (std::optional<std::string> silent = silent_member(round)) return end_round(round.number, *silent, true);
  if (round.num_nodes() < options_.max_nodes && !store_->check({round_key(round.number, "admits_at_checkpoints")})) {
    if (const int64_t n = waiting(round.number); n > 0)
      return end_round(round.number,
                       std::to_string(n) + (n == 1 ? " node waits" : " nodes wait") + " to join (the workers do not "
                       "admit nodes at checkpoints, so the round ends now)",
                       /*failure=*/false);
  }
  return "";
}

bool ElasticRendezvous::job_done() {
  const std::optional<std::string> done = get_if_set("done");
  if (done) leave(parse_count(*done, "done"));
  return done.has_value();
}

void ElasticRendezvous::finish_job(int64_t number) {
  store_->compare_set("done", {}, to_bytes(std::to_string(number)));
}

void ElasticRendezvous::leave(int64_t number) { store_->add(round_key(number, "left"), 1); }

void ElasticRendezvous::wait_for_others_to_leave(const RendezvousRound& round) {
  // Bounded by the others' lives: a member that neither leaves nor sends heartbeats is gone.
  while (store_->add(round_key(round.number, "left"), 0) < round.num_nodes() + waiting(round.number)) {
    if (silent_member(round)) return;
    std::this_thread::sleep_for(options_.poll_interval);
  }
}

bool ElasticRendezvous::job_alive(int64_t& watched) {
  if (store_->check({"done"})) return false;
  const int64_t number = current_round();
  if (number != watched) {
    watched = number;
    watched_since_ = Clock::now();
    serving_round_.reset();
  }
  if (!serving_round_) {
    if (const std::optional<int> members = closed_members(number))
      serving_round_ = read_round(number, *members, -1);
    // A round nobody closes in join_timeout plus its last call has nobody left to run it.
    else if (Clock::now() - watched_since_ > options_.join_timeout + options_.last_call_timeout)
      return false;
  }
  // A running round whose members are all silent has nobody left either.
  if (serving_round_) {
    const auto now = Clock::now();
    (void)silent_member(*serving_round_);  // refreshes seen_
    bool anyone = false;
    for (size_t i = 0; i < serving_round_->members.size(); ++i)
      if (serving_round_->members[i].id != me_.id && now - seen_[i].since < options_.heartbeat_timeout) anyone = true;
    if (!anyone) return false;
  }
  return true;
}

}  // namespace weft::parallel
