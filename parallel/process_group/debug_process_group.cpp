// DebugProcessGroup: fingerprints compared through the store before each collective.
#include "parallel/process_group/debug_process_group.h"

#include <cstdlib>
#include <sstream>
#include <string>

#include "core/error.h"

namespace weft::parallel {

bool distributed_debug_enabled() {
  const char* v = std::getenv("WEFT_DISTRIBUTED_DEBUG");
  if (v == nullptr) return false;
  const std::string s(v);
  return s == "1" || s == "DETAIL" || s == "detail" || s == "INFO" || s == "info";
}

namespace {

std::string describe(const Tensor& t) {
  std::ostringstream out;
  out << t.dtype() << " " << t.shape();
  return out.str();
}

std::string describe(const std::vector<Tensor>& list) {
  std::ostringstream out;
  out << list.size() << " x ";
  if (list.empty()) out << "none";
  else out << describe(list[0]);
  for (const Tensor& t : list)
    if (t.shape() != list[0].shape() || t.dtype() != list[0].dtype()) out << " (and " << describe(t) << ")";
  return out.str();
}

class DebugProcessGroup final : public ProcessGroup {
 public:
  DebugProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store)
      : ProcessGroup(inner->rank(), inner->size(), inner->timeout()), inner_(std::move(inner)), store_(std::move(store)) {}

  std::string backend_name() const override { return inner_->backend_name() + " (checked)"; }

  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override {
    check("all_reduce(" + describe(t) + ", " + reduce_op_name(op) + ")");
    return inner_->all_reduce(t, op);
  }
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override {
    check("broadcast(" + describe(t) + ", root " + std::to_string(root) + ")");
    return inner_->broadcast(t, root);
  }
  std::shared_ptr<Work> reduce(const Tensor& t, int root, ReduceOp op) override {
    check("reduce(" + describe(t) + ", root " + std::to_string(root) + ", " + reduce_op_name(op) + ")");
    return inner_->reduce(t, root, op);
  }
  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    check("all_gather(" + describe(input) + " into " + describe(outputs) + ")");
    return inner_->all_gather(outputs, input);
  }
  std::shared_ptr<Work> gather(const std::vector<Tensor>& outputs, const Tensor& input, int root) override {
    // Only the root gives outputs: they are not part of what every rank must agree on.
    check("gather(" + describe(input) + ", root " + std::to_string(root) + ")");
    return inner_->gather(outputs, input, root);
  }
  std::shared_ptr<Work> scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) override {
    check("scatter(into " + describe(output) + ", root " + std::to_string(root) + ")");
    return inner_->scatter(output, inputs, root);
  }
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) override {
    check("reduce_scatter(" + describe(inputs) + " into " + describe(output) + ", " + reduce_op_name(op) + ")");
    return inner_->reduce_scatter(output, inputs, op);
  }
  std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) override {
    check("all_to_all(" + describe(inputs) + " into " + describe(outputs) + ")");
    return inner_->all_to_all(outputs, inputs);
  }
  std::shared_ptr<Work> send(const Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  std::shared_ptr<Work> recv(const Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  std::shared_ptr<Work> barrier() override {
    check("barrier()");
    return inner_->barrier();
  }

 private:
  // Publishes this rank's fingerprint of call `seq`, then compares every rank's with it.
  void check(const std::string& call) {
    const int64_t seq = next_++;
    const std::string prefix = "call_" + std::to_string(seq) + "/rank_";
    store_->set(prefix + std::to_string(rank()), call);
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(prefix + std::to_string(r));
    try {
      store_->wait(keys, timeout());
    } catch (const Error& e) {
      std::string missing;
      for (int r = 0; r < size(); ++r)
        if (!store_->check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      WEFT_FAIL("collective check at call ", seq, " of the group: rank ", rank(), " called ", call, " but rank(s) ",
                missing, " made no collective call ", seq, " within ", timeout().count(), " ms");
    }
    std::vector<std::string> calls(size());
    for (int r = 0; r < size(); ++r) calls[r] = r == rank() ? call : store_->get_string(keys[r]);
    // Every rank has read every call before any of them reports (and perhaps exits, taking
    // rank 0's store server with it).
    const std::string seen = "call_" + std::to_string(seq) + "/seen_";
    store_->set(seen + std::to_string(rank()), std::string("1"));
    std::vector<std::string> seen_keys;
    for (int r = 0; r < size(); ++r) seen_keys.push_back(seen + std::to_string(r));
    store_->wait(seen_keys, timeout());
    // Every rank has read call seq: the keys of the call before can go (the store would
    // otherwise grow with every collective of a long run).
    if (seq > 0) {
      const std::string previous = "call_" + std::to_string(seq - 1) + "/";
      store_->delete_key(previous + "rank_" + std::to_string(rank()));
      store_->delete_key(previous + "seen_" + std::to_string(rank()));
    }
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const std::string& theirs = calls[r];
      WEFT_CHECK(theirs == call, "collective mismatch at call ", seq, " of the group: rank ", std::min(r, rank()),
                 " called ", r < rank() ? theirs : call, " but rank ", std::max(r, rank()), " called ",
                 r < rank() ? call : theirs);
    }
  }

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<Store> store_;
  int64_t next_ = 0;
};

}  // namespace

std::shared_ptr<ProcessGroup> debug_process_group(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store) {
  return std::make_shared<DebugProcessGroup>(std::move(inner), std::move(store));
}

}  // namespace weft::parallel
