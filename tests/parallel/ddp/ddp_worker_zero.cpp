// The ZeroRedundancyOptimizer scenarios of ddp_worker (started by
// tests/parallel/optim/test_zero_redundancy_optimizer.cpp): under DDP, a sharded optimizer must
// give the plain optimizer's weights and state bit for bit, since the gradients are already
// averaged and every update is elementwise.
#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <weft.h>

#include "ddp_worker_util.h"

namespace weft::ddp_worker {

namespace {

using parallel::DistributedDataParallel;
using parallel::ZeroRedundancyOptimizer;

parallel::DDPOptions small_buckets() {
  parallel::DDPOptions options;
  options.bucket_cap_mb = 0.02;
  options.first_bucket_mb = 0.005;
  return options;
}

// Whether a and b hold the same values, bit for bit (NaN never does); else where they differ.
bool identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::string* where) {
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k)
      if (!(x[k] == y[k])) {
        std::ostringstream out;
        out << "tensor " << i << " element " << k << ": " << x[k] << " vs " << y[k];
        *where = out.str();
        return false;
      }
  }
  return true;
}

// One DDP step of `model` on this rank's rows of the global batch of `step`.
void ddp_step(DistributedDataParallel& ddp, optim::Optimizer& optimizer, const std::string& model, int step,
              int64_t b) {
  const int rank = parallel::get_rank(), world = parallel::get_world_size();
  auto [x, y] = batch(step, world * b, sample_shape(model));
  optimizer.zero_grad();
  model_loss(model, ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
  optimizer.step();
}

// Two DDP replicas in each rank, one stepped by the plain optimizer, one by a
// ZeroRedundancyOptimizer over it.
struct SideBySide {
  std::string model;
  std::shared_ptr<nn::Module> plain_model, zero_model;
  std::unique_ptr<DistributedDataParallel> plain_ddp, zero_ddp;
  std::shared_ptr<optim::Optimizer> plain;
  std::shared_ptr<ZeroRedundancyOptimizer> zero;

  SideBySide(const std::string& model_name, const std::string& optimizer) : model(model_name) {
    plain_model = make_model(model);
    zero_model = make_model(model);
    plain_ddp = std::make_unique<DistributedDataParallel>(plain_model, nullptr, small_buckets());
    zero_ddp = std::make_unique<DistributedDataParallel>(zero_model, nullptr, small_buckets());
    plain = make_optimizer(optimizer, plain_model->parameters());
    zero = std::static_pointer_cast<ZeroRedundancyOptimizer>(make_optimizer("zero-" + optimizer,
                                                                            zero_model->parameters()));
  }

  // Steps [first, last) on both; false (after a failure naming the step) once they differ.
  bool train(int first, int last, int64_t b) {
    for (int step = first; step < last; ++step) {
      ddp_step(*plain_ddp, *plain, model, step, b);
      ddp_step(*zero_ddp, *zero, model, step, b);
      std::string where;
      if (!identical(zero_model->parameters(), plain_model->parameters(), &where)) {
        fail(model + ": after step " + std::to_string(step) + " the sharded optimizer's weights differ: " + where);
        return false;
      }
    }
    return true;
  }
};

}  // namespace

// 20 DDP steps with ZeroRedundancyOptimizer(OPTIMIZER) equal 20 with OPTIMIZER, bit for bit,
// each rank holding the state of its shard only, the shards balanced as PyTorch balances them.
int scenario_zero(const std::string& model, const std::string& optimizer) {
  parallel::init_process_group(backend(), parallel::InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = parallel::get_rank(), world = parallel::get_world_size();
  SideBySide s(model, optimizer);
  const std::vector<Tensor> params = s.zero_model->parameters();
  s.train(0, 20, 3);
  if (s.zero_model->parameters()[0].to_vector<double>() == make_model(model)->parameters()[0].to_vector<double>())
    fail(model + ": the weights did not change: the test cannot tell");

  // The partition: every parameter owned once; this rank's shard is what it owns; no rank
  // holds more elements than the least loaded one plus the largest parameter.
  const std::vector<int>& owners = s.zero->owners();
  std::vector<int64_t> elements(static_cast<size_t>(world), 0);
  std::vector<size_t> mine;
  int64_t largest = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (owners[i] < 0 || owners[i] >= world) fail("parameter " + std::to_string(i) + " has no owner");
    elements[static_cast<size_t>(owners[i])] += params[i].numel();
    largest = std::max(largest, params[i].numel());
    if (owners[i] == rank) mine.push_back(i);
  }
  if (s.zero->owned() != mine) fail("owned() is not the parameters owners() gives this rank");
  const auto [least, most] = std::minmax_element(elements.begin(), elements.end());
  if (*most - *least > largest) fail("unbalanced shards: " + std::to_string(*least) + " to " + std::to_string(*most));

  // The state: this rank's shard only, as much as the plain optimizer keeps for those parameters.
  int64_t plain_state = 0, own_state = 0, owned_elements = 0;
  for (const auto& [key, t] : s.plain->state_dict().tensors) plain_state += t.numel();
  for (size_t i : mine) owned_elements += params[i].numel();
  optim::Optimizer* shard = s.zero->shard_optimizer();
  if ((shard != nullptr) != !mine.empty()) fail("a shard optimizer exists exactly when the rank owns parameters");
  if (shard) {
    for (const auto& [key, t] : shard->state_dict().tensors) own_state += t.numel();
    if (shard->params().size() != mine.size()) fail("the shard optimizer holds other parameters than its shard");
  }
  const int64_t total_elements = [&] {
    int64_t n = 0;
    for (const Tensor& p : params) n += p.numel();
    return n;
  }();
  if (own_state * total_elements != plain_state * owned_elements)
    fail("this rank keeps " + std::to_string(own_state) + " state elements for its " +
         std::to_string(owned_elements) + " of " + std::to_string(total_elements) + " parameter elements; the plain "
         "optimizer keeps " + std::to_string(plain_state) + " for all");
  std::cout << "rank " << rank << " owns " << mine.size() << " of " << params.size() << " parameters, "
            << owned_elements << " of " << total_elements << " elements; state " << own_state << " of "
            << plain_state << " elements" << std::endl;
  parallel::destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// consolidate_state_dict onto the last rank (which owns nothing when the model has fewer
// parameters than there are ranks) gives there the plain optimizer's state_dict, bit for bit,
// and nowhere else; a step makes it stale; every rank loading the whole state into a new
// ZeroRedundancyOptimizer goes on as if training had never stopped.
int scenario_zero_checkpoint(const std::string& model, const std::string& optimizer) {
  parallel::init_process_group(backend(), parallel::InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = parallel::get_rank(), to = parallel::get_world_size() - 1;
  SideBySide s(model, optimizer);
  s.train(0, 10, 3);
  s.zero->set_initial_lr(0.5);
  s.plain->set_initial_lr(0.5);
  s.zero->consolidate_state_dict(to);
  if (rank == to) {
    const optim::OptimizerState mine = s.zero->state_dict(), theirs = s.plain->state_dict();
    if (mine.scalars != theirs.scalars) fail("the consolidated scalars differ from the plain optimizer's");
    if (mine.tensors.size() != theirs.tensors.size()) {
      fail("the consolidated state has " + std::to_string(mine.tensors.size()) + " tensors, the plain one " +
           std::to_string(theirs.tensors.size()));
    } else {
      for (size_t k = 0; k < mine.tensors.size(); ++k) {
        std::string where;
        if (mine.tensors[k].first != theirs.tensors[k].first)
          fail("state tensor " + std::to_string(k) + " is '" + mine.tensors[k].first + "', not '" +
               theirs.tensors[k].first + "'");
        else if (!mine.tensors[k].second.device().is_cpu())
          fail("the consolidated '" + mine.tensors[k].first + "' is not kept on the CPU");
        else if (!identical({mine.tensors[k].second.to(device())}, {theirs.tensors[k].second}, &where))
          fail("the consolidated '" + mine.tensors[k].first + "' differs: " + where);
      }
    }
  } else {
    try {
      s.zero->state_dict();
      fail("state_dict() worked on a rank the state was not gathered on");
    } catch (const Error& e) {
      if (std::string(e.what()).find("call consolidate_state_dict(" + std::to_string(rank) + ") on every rank first") ==
          std::string::npos)
        fail(std::string("unexpected error: ") + e.what());
    }
  }
  s.train(10, 11, 3);
  if (rank == to) {
    try {
      s.zero->state_dict();
      fail("a state consolidated before a step was returned after it");
    } catch (const Error& e) {
      if (std::string(e.what()).find("from before the last 1 step(s)") == std::string::npos)
        fail(std::string("unexpected error: ") + e.what());
    }
  }

  // Resume: a new sharded optimizer over the same weights, loaded with the whole state (here
  // the plain optimizer's, which the comparison above showed to be the consolidated one).
  s.zero = std::static_pointer_cast<ZeroRedundancyOptimizer>(make_optimizer("zero-" + optimizer,
                                                                            s.zero_model->parameters()));
  s.zero->load_state_dict(s.plain->state_dict());
  if (s.zero->initial_lr() != 0.5) fail("initial_lr was not restored");
  s.train(11, 20, 3);

  // A state that one shard alone can refuse (a state name only the owner of parameter 0
  // checks): every rank throws, naming that rank, and none has changed.
  optim::OptimizerState broken = s.plain->state_dict();
  broken.tensors.emplace_back("0.bogus", s.zero_model->parameters()[0].detach().clone());
  const int refusing = s.zero->owners()[0];
  try {
    s.zero->load_state_dict(broken);
    fail("a state with an unknown tensor was loaded");
  } catch (const Error& e) {
    const std::string expected = "rank " + std::to_string(refusing) + "'s shard refused the state" +
                                 (rank == refusing ? ": " : " (its error says why)");
    if (std::string(e.what()).find(expected) == std::string::npos) fail(std::string("unexpected error: ") + e.what());
  }
  s.train(20, 22, 3);
  parallel::destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Rank 1 gives one parameter fewer: every rank fails, naming the difference, instead of
// pairing different parameters in the broadcasts.
int scenario_zero_mismatch() {
  parallel::init_process_group(backend(), parallel::InitOptions{.timeout = std::chrono::seconds(20)});
  auto model = make_model("mlp");
  std::vector<Tensor> params = model->parameters();
  if (parallel::get_rank() == 1) params.pop_back();
  try {
    make_optimizer("zero-adam", params);
    fail("different parameter lists were accepted");
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << std::endl;
  }
  parallel::destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace weft::ddp_worker
