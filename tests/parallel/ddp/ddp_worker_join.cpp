// The ddp_worker scenarios of uneven inputs: DistributedDataParallel (and a
// ZeroRedundancyOptimizer) inside parallel::join, each rank with its own number of batches.
//
// Note [The join's reference]. Every rank computes, in one process, what the job must give,
// and checks its replica against it:
// - step s is taken by the ranks that have a batch s (the active ranks A); its gradient is
//   the sum over A of each one's gradient, divided by the world size (or by |A| with
//   divide_by_initial_world_size = false), one optimizer step on it: every active rank
//   holds the same parameters, a rank that ran out keeps its last ones until the end;
// - buffers (BatchNorm's running statistics in training mode): before each forward round,
//   every rank takes those of the highest rank still iterating (as its last forward left
//   them), and each forward then updates its own, so the reference keeps every rank's
//   buffers and runs each active rank's forward from the broadcast ones;
// - at the end every rank holds the model of the highest rank among those that ran out
//   last, i.e. the reference's parameters and the buffers of the last round, and (weft's
//   choice, parallel/ddp/distributed_data_parallel.h) the gradients of the last step: those
//   that ran out earlier received them while shadowing.
#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <weft.h>

#include "ddp_worker_util.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/optim/zero_redundancy_optimizer.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/join.h"

using namespace weft;
using namespace weft::parallel;

namespace weft::ddp_worker {

namespace {

std::vector<int> parse_counts(const std::string& text) {
  std::vector<int> counts;
  std::stringstream in(text);
  for (std::string piece; std::getline(in, piece, ',');) counts.push_back(std::stoi(piece));
  return counts;
}

// An MLP beside a layer that never takes part: DDP needs find_unused_parameters.
struct WithUnused : nn::Cloneable<WithUnused> {
  WithUnused() : Cloneable("WithUnused") {
    register_module("body", make_model("mlp"));
    Generator gen(11);
    register_module("unused", std::make_shared<nn::Linear>(20, 10, true, TensorOptions(DType::Float64), &gen));
    to(device());
  }
  Tensor forward(const Tensor& x) override { return child("body")(x); }
};

// "mlp", "unused" (WithUnused) or "bn" (ResNet with BatchNorm in training mode).
std::shared_ptr<nn::Module> make_join_model(const std::string& name) {
  if (name == "unused") return std::make_shared<WithUnused>();
  if (name == "bn") {
    auto m = make_model("resnet");
    m->train();
    return m;
  }
  return make_model(name);
}

Shape join_sample_shape(const std::string& model) { return sample_shape(model == "bn" ? "resnet" : "mlp"); }

// Rank r's k-th micro-batch of b rows.
std::pair<Tensor, Tensor> rank_batch(int r, int k, int64_t b, const Shape& sample) {
  Generator gen(5000 + 1000 * r + k);
  Shape shape = sample;
  shape.insert(0, b);
  return {randn(shape, TensorOptions(DType::Float64), &gen).to(device()),
          randint(0, 10, {b}, DType::Int64, &gen).to(device())};
}

std::vector<Tensor> snapshot(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

void restore(const std::vector<Tensor>& into, const std::vector<Tensor>& from) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < into.size(); ++i) into[i].detach().copy_(from[i]);
}

// Gradients, with zeros where there is none, and which ones there are.
std::vector<Tensor> grads_of(const std::vector<Tensor>& params, std::string* defined) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    *defined += p.grad().defined() ? '1' : '0';
    out.push_back(p.grad().defined() ? p.grad() : zeros(p.shape(), TensorOptions(p.dtype(), p.device())));
  }
  return out;
}

struct Reference {
  std::shared_ptr<nn::Module> model;
  std::vector<Tensor> buffers;  // the last round's
};

// Note [The join's reference].
Reference reference_run(const std::string& model, const std::string& optimizer, const std::vector<int>& counts,
                        bool divide_by_initial, int micro, int64_t b) {
  const int world = static_cast<int>(counts.size());
  Reference ref{make_join_model(model), {}};
  auto opt = make_optimizer(unsharded(optimizer), ref.model->parameters());
  const std::vector<Tensor> buffers = ref.model->buffers();
  std::vector<std::vector<Tensor>> rank_buffers(world, snapshot(buffers));  // each rank's, after its last forward
  const int steps = *std::max_element(counts.begin(), counts.end());
  for (int s = 0; s < steps; ++s) {
    std::vector<int> active;
    for (int r = 0; r < world; ++r)
      if (counts[r] > s) active.push_back(r);
    const double divisor = divide_by_initial ? world : static_cast<double>(active.size());
    opt->zero_grad();
    for (int m = 0; m < micro; ++m) {
      const std::vector<Tensor> broadcast = rank_buffers[active.back()];
      for (int r = 0; r < world; ++r) rank_buffers[r] = broadcast;
      for (int r : active) {
        restore(buffers, broadcast);
        auto [x, y] = rank_batch(r, s * micro + m, b, join_sample_shape(model));
        (cross_entropy(ref.model->forward(x), y) * (1.0 / divisor)).backward();
        rank_buffers[r] = snapshot(buffers);
      }
    }
    opt->step();
  }
  // The highest rank among those that ran out last: its model reaches every rank.
  for (int r = world; r-- > 0;)
    if (counts[r] == steps) {
      ref.buffers = rank_buffers[r];
      break;
    }
  restore(buffers, ref.buffers);
  return ref;
}

}  // namespace

// ddp_worker join MODEL OPTIMIZER COUNTS [active] [micro2] [views] [fp16]: rank r trains on
// COUNTS[r] batches inside a join; `active` divides by the ranks still iterating, `micro2`
// makes each step two micro-batches, the first under no_sync, `views` sets
// gradient_as_bucket_view, `fp16` registers the fp16 compression hook.
int scenario_join(const std::string& model, const std::string& optimizer, const std::string& counts_text,
                  const std::vector<std::string>& flags) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank();
  const std::vector<int> counts = parse_counts(counts_text);
  if (static_cast<int>(counts.size()) != get_world_size()) {
    fail("COUNTS lists " + std::to_string(counts.size()) + " ranks");
    return 1;
  }
  auto flagged = [&](const char* flag) { return std::find(flags.begin(), flags.end(), flag) != flags.end(); };
  const bool divide_by_initial = !flagged("active");
  const int micro = flagged("micro2") ? 2 : 1;
  const bool fp16 = flagged("fp16");
  const int64_t b = 3;
  std::string what = model + "/" + optimizer + "/" + counts_text;
  for (const std::string& flag : flags) what += "/" + flag;

  auto local = make_join_model(model);
  DDPOptions options;
  options.bucket_cap_mb = 0.01;  // several buckets
  options.first_bucket_mb = 0.002;
  options.find_unused_parameters = model == "unused";
  options.gradient_as_bucket_view = flagged("views");
  DistributedDataParallel ddp(local, nullptr, options);
  if (fp16) ddp.register_comm_hook(fp16_compress_hook());
  auto opt = make_optimizer(optimizer, local->parameters());
  std::vector<Joinable*> joinables{&ddp};
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(opt.get())) joinables.push_back(zero);
  JoinOptions join_options;
  join_options.divide_by_initial_world_size = divide_by_initial;
  int steps = 0;
  join(
      joinables,
      [&] {
        if (!ddp.in_join()) fail("the body runs outside a join");
        for (int s = 0; s < counts[rank]; ++s) {
          opt->zero_grad();
          for (int m = 0; m < micro; ++m) {
            auto [x, y] = rank_batch(rank, s * micro + m, b, join_sample_shape(model));
            std::optional<DistributedDataParallel::NoSync> no_sync;
            if (m + 1 < micro) no_sync.emplace(ddp);
            cross_entropy(ddp(x), y).backward();
          }
          opt->step();
          ++steps;
          if (rank == 0 && s == 0 && model != "bn") {
            NoGradGuard no_grad;  // an evaluation forward makes no collective: the others do not see it
            ddp(rank_batch(rank, 999, b, join_sample_shape(model)).first);
          }
        }
      },
      join_options);
  if (ddp.in_join()) fail("still in a join after it returned");
  if (steps != counts[rank]) fail("took " + std::to_string(steps) + " steps");

  const Reference ref = reference_run(model, optimizer, counts, divide_by_initial, micro, b);
  // fp16: each gradient rounded to float16 (11 bits) on its way; the weights stay within
  // 3e-2 of the reference (as in the hooks' own test), and the last gradients are compared
  // across the ranks (every rank must hold the same) instead of with the reference.
  const double rtol = fp16 ? 3e-2 : 1e-9;
  std::string where;
  if (!close(local->parameters(), ref.model->parameters(), rtol, &where))
    fail(what + ": parameters differ from the reference: " + where);
  if (!close(local->buffers(), ref.buffers, 1e-9, &where)) fail(what + ": buffers differ from the reference: " + where);
  std::string mine, theirs;
  const auto grads = grads_of(local->parameters(), &mine);
  const auto ref_grads = grads_of(ref.model->parameters(), &theirs);
  if (mine != theirs) {
    fail(what + ": gradients defined " + mine + ", the reference's " + theirs);
  } else if (fp16) {
    for (const Tensor& g : grads) {
      Tensor highest = g.clone(), lowest = g.clone();
      default_group().all_reduce(highest, ReduceOp::Max)->wait();
      default_group().all_reduce(lowest, ReduceOp::Min)->wait();
      if (!close({highest}, {lowest}, 0, &where)) fail(what + ": the ranks' last gradients differ: " + where);
    }
  } else if (!close(grads, ref_grads, 1e-9, &where)) {
    fail(what + ": gradients differ from the last step's: " + where);
  }
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// ddp_worker join_throw COUNTS: with throw_on_early_termination, every rank throws at the
// iteration where the first rank runs out; the others' errors name it.
int scenario_join_throw(const std::string& counts_text) {
  init_process_group(backend(), InitOptions{.timeout = std::chrono::seconds(60)});
  const int rank = get_rank();
  const std::vector<int> counts = parse_counts(counts_text);
  const int fewest = *std::min_element(counts.begin(), counts.end());
  std::string first_out;
  for (size_t r = 0; r < counts.size(); ++r)
    if (counts[r] == fewest) first_out += (first_out.empty() ? "" : ", ") + std::to_string(r);
  auto local = make_model("mlp");
  DistributedDataParallel ddp(local);
  optim::SGD sgd(local->parameters(), optim::SGDOptions{0.05});
  int steps = 0;
  try {
    ddp.join(
        [&] {
          for (int s = 0; s < counts[rank]; ++s) {
            sgd.zero_grad();
            auto [x, y] = rank_batch(rank, s, 2, Shape{20});
            cross_entropy(ddp(x), y).backward();
            sgd.step();
            ++steps;
          }
        },
        JoinOptions{.throw_on_early_termination = true});
    fail("no rank threw");
  } catch (const Error& e) {
    const std::string message = e.what();
    std::cout << "error: " << message << std::endl;
    const std::string expected = counts[rank] == fewest ? "this rank ran out of inputs"
                                                        : "rank(s) " + first_out + " ran out of inputs before this one";
    if (message.find(expected) == std::string::npos) fail("the error does not say '" + expected + "'");
  }
  if (steps != fewest) fail("took " + std::to_string(steps) + " steps before the error, not " + std::to_string(fewest));
  if (ddp.in_join()) fail("still in a join after the error");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace weft::ddp_worker
