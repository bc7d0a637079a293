// DistributedStrategy: join the group, wrap in DDP, shard the loaders, all-reduce the sums.
#include "train/distributed_strategy.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "core/error.h"
#include "core/trace.h"
#include "parallel/comm_hooks.h"
#include "parallel/distributed.h"
#include "parallel/post_localsgd_optimizer.h"
#include "parallel/sync_batch_norm.h"
#include "parallel/zero_redundancy_optimizer.h"
#include "train/launch.h"

namespace weft::train {

DistributedStrategy::DistributedStrategy(DistributedStrategyOptions options) : options_(std::move(options)) {
  WEFT_CHECK(options_.local_sgd_period >= 0 && options_.local_sgd_warmup >= 0, "DistributedStrategy: "
             "local_sgd_period and local_sgd_warmup must be >= 0, got ", options_.local_sgd_period, " and ",
             options_.local_sgd_warmup);
  WEFT_CHECK(options_.local_sgd_period > 0 || options_.local_sgd_warmup == 0, "DistributedStrategy: "
             "local_sgd_warmup ", options_.local_sgd_warmup, " without local SGD (local_sgd_period is 0)");
  WEFT_CHECK(options_.local_sgd_period == 0 || options_.comm_hook == "allreduce", "DistributedStrategy: local SGD "
             "brings its own communication hook (post-local SGD), so comm_hook '", options_.comm_hook,
             "' cannot be used with it");
  device_ = join_job(options_.device, options_.backend);
  group_ = parallel::default_group_ptr();
}

std::shared_ptr<nn::Module> DistributedStrategy::prepare(std::shared_ptr<nn::Module> model) {
  model->to(device_);
  if (options_.sync_batch_norm) {
    const auto modules = model->named_modules();
    const bool any = std::any_of(modules.begin(), modules.end(), [](const auto& entry) {
      return dynamic_cast<const nn::BatchNorm2d*>(entry.second) != nullptr;
    });
    if (!any && rank() == 0)
      std::cerr << "weft: sync_batch_norm: the " << model->type_name() << " model has no BatchNorm2d layer, so there "
                << "are no statistics to synchronise" << std::endl;
    model = parallel::SyncBatchNorm::convert(std::move(model), group_);
  }
  ddp_ = std::make_shared<parallel::DistributedDataParallel>(std::move(model), group_, options_.ddp);
  if (options_.comm_hook != "allreduce") ddp_->register_comm_hook(parallel::comm_hook_named(options_.comm_hook));
  if (options_.local_sgd_period > 0) {
    // No gradient crosses between the ranks after the warm-up: the replicas meet in the averages.
    local_sgd_ = std::make_shared<parallel::PostLocalSGDState>(
        parallel::PostLocalSGDOptions{.start_iteration = options_.local_sgd_warmup,
                                      .post_local_gradient_allreduce = false,
                                      .subgroup = std::nullopt});
    ddp_->register_comm_hook(parallel::post_localsgd_hook(local_sgd_));
    averager_ = std::make_unique<parallel::PeriodicModelAverager>(options_.local_sgd_period,
                                                                  options_.local_sgd_warmup, group_);
    params_ = ddp_->module().parameters();
  }
  return ddp_;
}

void DistributedStrategy::check_local_sgd_optimizer(const optim::Optimizer& optimizer) const {
  WEFT_CHECK(dynamic_cast<const parallel::ZeroRedundancyOptimizer*>(&optimizer) == nullptr, "DistributedStrategy: "
             "local SGD needs every rank to step its own replica, but a ZeroRedundancyOptimizer steps one shard per "
             "rank and broadcasts it, which makes the replicas equal at every step; use the optimizer it wraps");
  WEFT_CHECK(dynamic_cast<const parallel::PostLocalSGDOptimizer*>(&optimizer) == nullptr, "DistributedStrategy: "
             "with local_sgd_period the strategy averages the replicas itself; give the loop the optimizer the ",
             optimizer.name(), " wraps, or drop local_sgd_period");
}

Tensor DistributedStrategy::train_step(nn::Module& model, const data::Batch& batch, const Criterion& criterion,
                                       optim::Optimizer& optimizer) {
  if (!averager_) return Strategy::train_step(model, batch, criterion, optimizer);
  check_local_sgd_optimizer(optimizer);
  // The hook counts this backward; the averager counts this step and averages on its schedule.
  Tensor loss = Strategy::train_step(model, batch, criterion, optimizer);
  std::optional<TraceSpan> span;  // only where this step averages
  if (averager_->averages_at(averager_->step())) span.emplace("average parameters", device_);
  averager_->average_parameters(params_);
  return loss;
}

void DistributedStrategy::consolidate_replicas(optim::Optimizer& optimizer) {
  // Before the first local step the replicas are equal: averaging them could only round.
  if (!local_sgd_ || local_sgd_->iteration() <= options_.local_sgd_warmup) return;
  TraceSpan span("average replicas", device_);
  // The parameters, the floating buffers (running statistics: each rank's own after its last
  // forward) and the optimizer's state tensors (aliases of its own), in one list: one
  // all-reduce per dtype.
  std::vector<Tensor> state = params_;
  for (const Tensor& b : ddp_->module().buffers())
    if (is_floating(b.dtype())) state.push_back(b);
  const size_t own = state.size();
  for (const auto& [name, t] : optimizer.state_dict().tensors)
    if (is_floating(t.dtype())) state.push_back(t);
  // Every rank must average the same list, or the flattened all-reduces would not line up.
  double elements = 0;
  for (size_t i = own; i < state.size(); ++i) elements += static_cast<double>(state[i].numel());
  const double count = static_cast<double>(state.size() - own);
  Tensor extremes = tensor(std::vector<double>{count, elements, -count, -elements});
  if (!device_.is_cpu()) extremes = extremes.to(device_);
  group_->all_reduce(extremes, parallel::ReduceOp::Max)->wait();
  const auto e = extremes.to(kCPU).to_vector<double>();
  WEFT_CHECK(e[0] == -e[2] && e[1] == -e[3], "DistributedStrategy: local SGD cannot average the optimizers' states: "
             "rank ", rank(), "'s ", optimizer.name(), " holds ", count, " state tensors of ", elements,
             " elements, but the ranks hold from ", -e[2], " to ", e[0], " tensors and from ", -e[3], " to ", e[1],
             " elements (a parameter that has had a gradient on some ranks only?)");
  parallel::average_parameters(state, *group_);
}

std::map<std::string, double> DistributedStrategy::state_dict() const {
  if (!averager_) return {};
  return {{"local_sgd_step", static_cast<double>(averager_->step())}};
}

void DistributedStrategy::check_state_dict(const std::map<std::string, double>& state) const {
  auto it = state.find("local_sgd_step");
  if (!averager_ || it == state.end()) return;
  const double step = it->second;
  WEFT_CHECK(step >= 0 && step <= 9007199254740992.0 && step == std::floor(step), "the checkpoint's "
             "strategy.local_sgd_step is ", step, ", not a count of steps");
}

void DistributedStrategy::load_state_dict(const std::map<std::string, double>& state) {
  check_state_dict(state);
  if (!averager_) return;
  auto it = state.find("local_sgd_step");
  const double step = it != state.end() ? it->second : 0.0;
  if (it == state.end() && rank() == 0)
    std::cerr << "weft: local SGD: the checkpoint was written without it, so its step count starts at 0"
              << (options_.local_sgd_warmup > 0
                      ? "; its warm-up runs again (plain DDP up to step " +
                            std::to_string(options_.local_sgd_warmup) + ")"
                      : std::string())
              << std::endl;
  averager_->set_step(static_cast<int64_t>(step));
  local_sgd_->set_iteration(static_cast<int64_t>(step));
}

parallel::DistributedDataParallel& DistributedStrategy::ddp() const {
  WEFT_CHECK(ddp_ != nullptr, "DistributedStrategy: ddp() before prepare()");
  return *ddp_;
}

std::shared_ptr<data::DataLoader> DistributedStrategy::shard(std::shared_ptr<data::DataLoader> loader, bool training) {
  return shard_loader(*loader, training, world_size(), rank());
}

Totals DistributedStrategy::reduce(const Totals& local) {
  Tensor sums = tensor(std::vector<double>{local.loss, local.correct, local.samples, local.batches});
  if (!device_.is_cpu()) sums = sums.to(device_);
  group_->all_reduce(sums, parallel::ReduceOp::Sum)->wait();
  auto v = sums.to(kCPU).to_vector<double>();
  return {v[0], v[1], v[2], v[3]};
}

void DistributedStrategy::barrier() { group_->barrier()->wait(); }

}  // namespace weft::train
