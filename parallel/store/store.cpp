// PrefixStore: every key of one group (or one rendezvous round) lives under "<prefix>/",
// so several users of one underlying store never see each other's keys. Errors come from
// the underlying store and name the full, prefixed keys: that is what a user finds in it.
#include "parallel/store/store.h"

#include <utility>

#include "core/error.h"

namespace weft::parallel {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultTimeout), prefix_(std::move(prefix)), store_(std::move(store)) {
  WEFT_CHECK(store_ != nullptr, "PrefixStore('", prefix_, "'): the underlying store is null");
}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const std::string& k : ks) out.push_back(key(k));
  return out;
}

void PrefixStore::set(const std::string& k, const Bytes& value) { store_->set(key(k), value); }

// The underlying store's get waits for its own timeout; ours is the one a user set on
// this PrefixStore, so the wait goes through wait() with it.
Bytes PrefixStore::get(const std::string& k) {
  const std::string full = key(k);
  if (timeout() != store_->timeout()) store_->wait({full}, timeout());
  return store_->get(full);
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }

Bytes PrefixStore::compare_set(const std::string& k, const Bytes& expected, const Bytes& desired) {
  return store_->compare_set(key(k), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& ks) { return store_->check(keys(ks)); }

void PrefixStore::wait(const std::vector<std::string>& ks, std::chrono::milliseconds timeout) {
  store_->wait(keys(ks), timeout);
}

bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }

int64_t PrefixStore::num_keys() { return store_->num_keys(); }

}  // namespace weft::parallel
