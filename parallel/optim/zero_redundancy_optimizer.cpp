// ZeroRedundancyOptimizer: the partition, the step's broadcasts, and the state moved between
// shard numbering (a shard optimizer's parameter k) and global numbering (params()[i]).
#include "parallel/optim/zero_redundancy_optimizer.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/optim/optimizer_state_gather.h"
#include "parallel/process_group/collective_support.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/text_collectives.h"

namespace weft::parallel {

namespace {

constexpr const char* kWho = "ZeroRedundancyOptimizer";

// PyTorch's partition: largest parameters first, each to the rank with the fewest elements.
std::vector<int> partition(const std::vector<Tensor>& params, int ranks) {
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> sizes(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(params.size());
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    owner[i] = r;
    sizes[static_cast<size_t>(r)] += params[i].numel();
  }
  return owner;
}

// "0 is parameter 5, 1 is parameter 7, ..." (the first eight): how a shard's own indices,
// which its errors use, map to the wrapper's.
std::string shard_numbering(const std::vector<size_t>& owned) {
  std::string out;
  for (size_t k = 0; k < owned.size() && k < 8; ++k)
    out += (k ? ", " : "") + std::to_string(k) + " is parameter " + std::to_string(owned[k]);
  return out + (owned.size() > 8 ? ", ..." : "");
}

// The scalars the wrapper keeps itself rather than its shard optimizer.
bool is_wrapper_scalar(const std::string& key) {
  return key == "lr" || key == "num_params" || key == "initial_lr";
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, ShardOptimizerFactory make_shard_optimizer,
                                                 std::shared_ptr<ProcessGroup> group)
    : ZeroRedundancyOptimizer(Plan::make(std::move(params), std::move(make_shard_optimizer), std::move(group))) {}

ZeroRedundancyOptimizer::Plan ZeroRedundancyOptimizer::Plan::make(std::vector<Tensor> params,
                                                                  ShardOptimizerFactory make_shard_optimizer,
                                                                  std::shared_ptr<ProcessGroup> group) {
  WEFT_CHECK(make_shard_optimizer != nullptr, kWho, ": the shard optimizer factory is empty");
  WEFT_CHECK(!params.empty(), kWho, ": got an empty parameter list");
  Plan plan;
  plan.group = group ? std::move(group) : default_group_ptr();
  WEFT_CHECK(params[0].defined(), kWho, ": parameter 0 is an undefined tensor");
  plan.device = params[0].device();
  // Every rank must partition the same list, or the broadcasts of step() would pair
  // different parameters (and hang or corrupt the weights). A rank's own problem goes into
  // its description too, so that every rank stops, not only the one that sees it.
  std::vector<std::string> lines;
  for (size_t i = 0; i < params.size(); ++i) {
    std::ostringstream line;
    if (!params[i].defined())
      line << "parameter " << i << " is an undefined tensor";
    else if (params[i].device() != plan.device)
      line << "parameter " << i << " is on " << params[i].device() << " but parameter 0 is on " << plan.device
           << " (the parameters of a data-parallel replica share one device)";
    else
      line << "parameter " << i << " is " << params[i].dtype() << " " << params[i].shape();
    lines.push_back(line.str());
  }
  if (auto difference = first_difference_across_ranks(*plan.group, lines, plan.device))
    WEFT_FAIL(kWho, ": the ranks' parameters differ: ", *difference, " (every rank must give the same parameters, "
              "in the same order)");
  for (size_t i = 0; i < params.size(); ++i)
    WEFT_CHECK(params[i].defined() && params[i].device() == plan.device, kWho, ": ", lines[i]);

  plan.owner = partition(params, plan.group->size());
  std::vector<Tensor> shard;
  for (size_t i = 0; i < params.size(); ++i)
    if (plan.owner[i] == plan.group->rank()) {
      plan.owned.push_back(i);
      shard.push_back(params[i]);
    }
  // A rank that owns nothing still learns the optimizer's name and rate, from one made over
  // every parameter and dropped (optimizers make their state at their first step).
  std::shared_ptr<optim::Optimizer> made = make_shard_optimizer(shard.empty() ? params : shard);
  WEFT_CHECK(made != nullptr, kWho, ": the shard optimizer factory returned null");
  const std::vector<Tensor>& expected = shard.empty() ? params : shard;
  bool same = made->params().size() == expected.size();
  for (size_t k = 0; same && k < expected.size(); ++k) same = made->params()[k].is_same(expected[k]);
  WEFT_CHECK(same, kWho, ": the factory's ", made->name(), " optimizes other tensors than the shard it was given "
             "(build it over the factory's argument)");
  plan.name = std::string(kWho) + "(" + made->name() + ")";
  plan.lr = made->lr();
  if (!shard.empty()) plan.shard = std::move(made);
  plan.make_shard_optimizer = std::move(make_shard_optimizer);
  plan.params = std::move(params);
  return plan;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Plan plan)
    : Optimizer(std::move(plan.name), std::move(plan.params), plan.lr),
      group_(std::move(plan.group)),
      device_(plan.device),
      owner_(std::move(plan.owner)),
      owned_(std::move(plan.owned)),
      shard_(std::move(plan.shard)),
      make_shard_optimizer_(std::move(plan.make_shard_optimizer)) {}

void ZeroRedundancyOptimizer::step() {
  notify_join_context();  // in a join of this optimizer alone, not waited for: the count is not needed
  update_and_sync();
}

void ZeroRedundancyOptimizer::update_and_sync() {
  NoGradGuard no_grad;
  if (shard_) {
    shard_->set_lr(lr());  // schedulers set the wrapper's rate
    shard_->step();
  }
  sync_params();
  ++steps_;
}

// A rank that ran out of inputs steps too, after each iteration whose backward reduced (the
// others step after those; under no_sync they accumulate): its shard's update on the
// gradients DDP's join hook left (the others' average), then the broadcasts the others make.
class ZeroRedundancyOptimizer::StepWhileJoined : public JoinHook {
 public:
  explicit StepWhileJoined(ZeroRedundancyOptimizer& zero) : zero_(zero) {}
  void main_hook(JoinRound& round) override {
    if (round.gradients_reduced) zero_.update_and_sync();
  }

 private:
  ZeroRedundancyOptimizer& zero_;
};

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook(const JoinOptions&) {
  return std::make_unique<StepWhileJoined>(*this);
}

// Every parameter from its owner: one broadcast per (owner, dtype) of the owner's parameters
// flattened, all in flight at once, then copied into the replicas' parameters.
void ZeroRedundancyOptimizer::sync_params() {
  if (group_->size() == 1) return;
  TraceSpan span("zero: broadcast parameters", device_);
  struct Message {
    std::vector<Tensor> params;
    Tensor flat;
    int root = 0;
  };
  std::vector<Message> messages;
  for (int r = 0; r < group_->size(); ++r) {
    std::vector<DType> dtypes;
    for (size_t i = 0; i < params().size(); ++i)
      if (owner_[i] == r && std::find(dtypes.begin(), dtypes.end(), params()[i].dtype()) == dtypes.end())
        dtypes.push_back(params()[i].dtype());
    for (DType dtype : dtypes) {
      Message m;
      m.root = r;
      for (size_t i = 0; i < params().size(); ++i)
        if (owner_[i] == r && params()[i].dtype() == dtype) m.params.push_back(params()[i]);
      if (r == group_->rank()) {
        m.flat = detail::flatten(m.params);
      } else {
        int64_t n = 0;
        for (const Tensor& p : m.params) n += p.numel();
        m.flat = empty({n}, TensorOptions(dtype, device_));
      }
      messages.push_back(std::move(m));
    }
  }
  std::vector<std::shared_ptr<Work>> works;
  for (const Message& m : messages) works.push_back(group_->broadcast(m.flat, m.root));
  for (auto& w : works) w->wait();
  for (const Message& m : messages)
    if (m.root != group_->rank()) detail::unflatten_into(m.flat, m.params);
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  detail::check_rank(to, group_->size(), "to", std::string(kWho) + ".consolidate_state_dict");
  NoGradGuard no_grad;
  TraceSpan span("zero: consolidate state", device_);
  // This rank's shard of the state, renamed to global indices; a shard's own problem travels
  // with it, so that every rank stops on it together.
  optim::OptimizerState global;
  std::string problem;
  if (shard_) {
    shard_->set_lr(lr());
    const optim::OptimizerState mine = shard_->state_dict();
    for (const auto& [key, t] : mine.tensors) {
      auto split = split_state_key(key);
      if (!split || split->first >= owned_.size()) {
        if (problem.empty())
          problem = "the " + shard_->name() + " shard's state tensor '" + key + "' does not name one of its " +
                    std::to_string(owned_.size()) + " parameters";
        continue;
      }
      global.tensors.emplace_back(std::to_string(owned_[split->first]) + "." + split->second, t);
    }
    for (const auto& [key, value] : mine.scalars) {
      if (is_wrapper_scalar(key)) continue;
      auto split = split_state_key(key);
      global.scalars[split && split->first < owned_.size()
                         ? std::to_string(owned_[split->first]) + "." + split->second
                         : key] = value;
    }
  }
  // Each tensor sent by its owner to `to` alone, in the order of the parameters (a plain
  // optimizer's order).
  optim::OptimizerState whole = gather_optimizer_state(*group_, global, to, device_,
                                                       std::string(kWho) + ".consolidate_state_dict", problem);
  if (to != group_->rank()) {
    consolidated_.reset();
    return;
  }
  whole.scalars["num_params"] = static_cast<double>(params().size());
  consolidated_ = std::move(whole);
  consolidated_at_ = steps_;
}

optim::OptimizerState ZeroRedundancyOptimizer::state_dict() const {
  WEFT_CHECK(consolidated_.has_value(), name(), ".state_dict: the state is spread over the ranks and has not been "
             "gathered on this rank (rank ", group_->rank(), "): call consolidate_state_dict(", group_->rank(),
             ") on every rank first");
  WEFT_CHECK(consolidated_at_ == steps_, name(), ".state_dict: the state gathered on this rank is from before the "
             "last ", steps_ - consolidated_at_, " step(s): call consolidate_state_dict(", group_->rank(),
             ") on every rank again");
  optim::OptimizerState out = *consolidated_;
  out.scalars["lr"] = lr();
  if (initial_lr()) out.scalars["initial_lr"] = *initial_lr();
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const optim::OptimizerState& state) {
  const std::string where = name() + ".load_state_dict";
  const auto& scalars = state.scalars;
  if (auto count = scalars.find("num_params"); count != scalars.end())
    WEFT_CHECK(count->second == static_cast<double>(params().size()), where, ": the state holds ", count->second,
               " parameters but this optimizer has ", params().size());
  auto lr = scalars.find("lr");
  WEFT_CHECK(lr != scalars.end(), where, ": the state has no 'lr' scalar");
  WEFT_CHECK(lr->second >= 0, where, ": invalid learning rate: ", lr->second, " (must be >= 0)");
  // Every rank checks every entry's index and shape, so that all refuse a bad state alike;
  // the shard optimizer then checks the names and hyperparameters of its own entries.
  std::vector<size_t> local(params().size(), SIZE_MAX);
  for (size_t k = 0; k < owned_.size(); ++k) local[owned_[k]] = k;
  optim::OptimizerState shard;
  for (const auto& [key, value] : state.tensors) {
    auto split = split_state_key(key);
    WEFT_CHECK(split, where, ": unexpected tensor '", key, "' (state tensors are named '<param index>.<name>')");
    WEFT_CHECK(split->first < params().size(), where, ": tensor '", key, "' names parameter ", split->first,
               " but this optimizer has ", params().size(), " parameters");
    const Tensor& p = params()[split->first];
    WEFT_CHECK(value.defined() && value.shape() == p.shape(), where, ": tensor '", key, "' has shape ",
               value.defined() ? value.shape() : Shape{}, " but parameter ", split->first, " has shape ", p.shape());
    if (local[split->first] != SIZE_MAX)
      shard.tensors.emplace_back(std::to_string(local[split->first]) + "." + split->second, value);
  }
  for (const auto& [key, value] : scalars) {
    if (is_wrapper_scalar(key)) continue;
    auto split = split_state_key(key);
    if (!split) {
      shard.scalars[key] = value;  // a hyperparameter: every shard takes it
      continue;
    }
    WEFT_CHECK(split->first < params().size(), where, ": scalar '", key, "' names parameter ", split->first,
               " but this optimizer has ", params().size(), " parameters");
    if (local[split->first] != SIZE_MAX)
      shard.scalars[std::to_string(local[split->first]) + "." + split->second] = value;
  }
  // The shard loads into a new optimizer, kept only if every rank's shard accepts its part:
  // slot names and hyperparameters are checked by the owners alone, and a rank that failed
  // by itself would leave the others waiting in their next collective.
  std::shared_ptr<optim::Optimizer> loaded;
  std::string refusal;
  if (shard_) {
    shard.scalars["lr"] = lr->second;
    shard.scalars["num_params"] = static_cast<double>(owned_.size());
    try {
      std::vector<Tensor> mine;
      for (size_t i : owned_) mine.push_back(params()[i]);
      loaded = make_shard_optimizer_(mine);
      loaded->load_state_dict(shard);
    } catch (const Error& e) {
      refusal = e.what();
    }
  }
  Tensor first_refusing = tensor(std::vector<int64_t>{refusal.empty() ? group_->size() : group_->rank()}).to(device_);
  if (group_->size() > 1) group_->all_reduce(first_refusing, ReduceOp::Min)->wait();
  const int64_t refusing = first_refusing.item<int64_t>();
  if (refusing == group_->rank())
    WEFT_FAIL(where, ": rank ", refusing, "'s shard refused the state: ", refusal, " (the shard numbers its parameters "
              "0, 1, ... in the order of owned(): ", shard_numbering(owned_), ")");
  WEFT_CHECK(refusing == group_->size(), where, ": rank ", refusing, "'s shard refused the state (its error says why); "
             "no rank loaded it");
  if (loaded) shard_ = std::move(loaded);
  set_lr(lr->second);
  if (auto initial = scalars.find("initial_lr"); initial != scalars.end()) set_initial_lr(initial->second);
  consolidated_.reset();
}

}  // namespace weft::parallel
