// A barrier over the store that names the ranks missing; see monitored_barrier.h.
#include "parallel/process_group/monitored_barrier.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/process_group/distributed.h"
#include "parallel/store/store.h"

namespace weft::parallel {

namespace {

// The monitored barriers of one default group are numbered, so that each has its own keys
// (every rank calls them in the same order). A new default group starts again from 0.
int64_t next_barrier_number(const std::shared_ptr<Store>& store) {
  static std::mutex mutex;
  static std::weak_ptr<Store> numbered;
  static int64_t next = 0;
  std::lock_guard lock(mutex);
  if (numbered.lock() != store) {
    numbered = store;
    next = 0;
  }
  return next++;
}

constexpr const char* kReleased = "released";

}  // namespace

void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks) {
  const std::shared_ptr<Store> store = default_store();
  const int rank = get_rank(), world = get_world_size();
  if (timeout.count() <= 0) timeout = store->timeout();
  WEFT_CHECK(timeout.count() > 0, "monitored_barrier: the timeout must be positive");
  const std::string prefix = "monitored_barrier/" + std::to_string(next_barrier_number(store)) + "/";
  const std::string release = prefix + "release";
  if (rank != 0) {
    store->set(prefix + "arrived/" + std::to_string(rank), "1");
    // Rank 0 may arrive up to a timeout after this rank and then wait up to a timeout for the
    // others: its answer comes within twice the timeout.
    const auto patience = 2 * timeout;
    try {
      store->wait({release}, patience);
    } catch (const Error&) {
      WEFT_FAIL("monitored_barrier: rank ", rank, " arrived, but rank 0 did not release the barrier within ",
                patience.count(), " ms (twice the timeout: rank 0 did not reach it, or its store is gone)");
    }
    const std::string outcome = store->get_string(release);
    WEFT_CHECK(outcome == kReleased, outcome);
    return;
  }
  // Rank 0: each rank in turn, with what is left of the timeout; past the deadline only a
  // look, so that wait_all_ranks names every rank missing then.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < world; ++r) {
    const std::string key = prefix + "arrived/" + std::to_string(r);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool arrived = store->check({key});
    if (!arrived && left.count() > 0) {
      try {
        store->wait({key}, left);
        arrived = true;
      } catch (const Error&) {
        arrived = store->check({key});  // a lost store throws here, with its own message
      }
    }
    if (arrived) continue;
    missing.push_back(r);
    if (!wait_all_ranks) break;
  }
  if (missing.empty()) {
    store->set(release, kReleased);
    return;
  }
  std::string ranks;
  for (size_t i = 0; i < missing.size(); ++i) ranks += (i ? ", " : "") + std::to_string(missing[i]);
  const std::string failure = "monitored_barrier: rank" + std::string(missing.size() > 1 ? "s " : " ") + ranks +
                              " did not reach the barrier within " + std::to_string(timeout.count()) + " ms" +
                              (wait_all_ranks ? "" : " (the first missing; wait_all_ranks names them all)");
  store->set(release, failure);  // the ranks that arrived throw it too
  WEFT_FAIL(failure);
}

}  // namespace weft::parallel
