// DistributedStrategy: the job's mesh built from the plan, and each dimension's part of the
// loop: DDP along dp_replicate alone; stages along pp, their gradients averaged along
// dp_replicate; loaders sharded and sums added along dp_replicate, checked along pp.
#include "train/distributed_strategy.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/ddp/comm_hook_registry.h"
#include "parallel/ddp/sync_batch_norm.h"
#include "parallel/optim/optimizer_state_gather.h"
#include "parallel/pipeline/tensor_header.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/value_agreement.h"
#include "train/launch.h"
#include "train/pipeline_strategy.h"

namespace weft::train {

namespace {

constexpr const char* kWho = "DistributedStrategy";

}  // namespace

DistributedStrategy::DistributedStrategy(DistributedStrategyOptions options) : options_(std::move(options)) {
  WEFT_CHECK(options_.local_sgd_period >= 0 && options_.local_sgd_warmup >= 0, "DistributedStrategy: "
             "local_sgd_period and local_sgd_warmup must be >= 0, got ", options_.local_sgd_period, " and ",
             options_.local_sgd_warmup);
  WEFT_CHECK(options_.local_sgd_period > 0 || options_.local_sgd_warmup == 0, "DistributedStrategy: "
             "local_sgd_warmup ", options_.local_sgd_warmup, " without local SGD (local_sgd_period is 0)");
  WEFT_CHECK(options_.local_sgd_period == 0 || options_.comm_hook == "allreduce", "DistributedStrategy: local SGD "
             "brings its own communication hook (post-local SGD), so comm_hook '", options_.comm_hook,
             "' cannot be used with it");
  if (options_.plan.pipelined())
    WEFT_CHECK(options_.local_sgd_period == 0 && options_.comm_hook == "allreduce" && !options_.sync_batch_norm,
               "DistributedStrategy: the plan ", options_.plan.str(), " has a pipeline, whose stages average their "
               "gradients over their replicas themselves: local SGD, communication hooks and SyncBatchNorm are DDP's "
               "(a plan without pp)");
  device_ = join_job(options_.device, options_.backend);
  group_ = parallel::default_group_ptr();
  plan_ = options_.plan.resolved(group_->size());
  mesh_ = std::make_unique<parallel::DeviceMesh>(plan_.dimensions());
  if (plan_.pipelined()) pipeline_mesh_ = parallel::pipeline::pipeline_mesh(*mesh_);
}

ParallelMode DistributedStrategy::mode() const {
  return plan_.pipelined() ? ParallelMode::Pipeline : ParallelMode::DistributedDataParallel;
}

std::shared_ptr<nn::Module> DistributedStrategy::prepare_model(std::shared_ptr<nn::Module> model) {
  return plan_.pipelined() ? prepare_pipeline(std::move(model)) : prepare_replicas(std::move(model));
}

// --- data parallelism alone: DDP over dp_replicate ----------------------------------------

std::shared_ptr<nn::Module> DistributedStrategy::prepare_replicas(std::shared_ptr<nn::Module> model) {
  const std::shared_ptr<parallel::ProcessGroup>& replicas = mesh_->group("dp_replicate");
  model->to(device_);
  if (options_.sync_batch_norm) {
    if (parallel::SyncBatchNorm::batch_norm_layers(*model) == 0 && rank() == 0)
      std::cerr << "weft: sync_batch_norm: the " << model->type_name() << " model has no BatchNorm2d layer, so there "
                << "are no statistics to synchronise" << std::endl;
    model = parallel::SyncBatchNorm::convert(std::move(model), replicas);
  }
  ddp_ = std::make_shared<parallel::DistributedDataParallel>(std::move(model), replicas, options_.ddp);
  if (options_.comm_hook != "allreduce") ddp_->register_comm_hook(parallel::comm_hook_named(options_.comm_hook));
  if (options_.local_sgd_period > 0) {
    // No gradient crosses between the ranks after the warm-up: the replicas meet in the averages.
    local_sgd_ = std::make_shared<parallel::PostLocalSGDState>(
        parallel::PostLocalSGDOptions{.start_iteration = options_.local_sgd_warmup,
                                      .post_local_gradient_allreduce = false,
                                      .subgroup = std::nullopt});
    ddp_->register_comm_hook(parallel::post_localsgd_hook(local_sgd_));
    averager_ = std::make_unique<parallel::PeriodicModelAverager>(options_.local_sgd_period,
                                                                  options_.local_sgd_warmup, replicas);
    params_ = ddp_->module().parameters();
  }
  return ddp_;
}

void DistributedStrategy::check_local_sgd_optimizer(const optim::Optimizer& optimizer) const {
  WEFT_CHECK(optimizer.step_scope() != optim::StepScope::ShardedAcrossRanks, "DistributedStrategy: local SGD needs "
             "every rank to step its own replica, but a ", optimizer.name(), " steps one shard per rank and broadcasts "
             "it, which makes the replicas equal at every step; use the optimizer it wraps");
  WEFT_CHECK(optimizer.step_scope() != optim::StepScope::AveragesReplicas, "DistributedStrategy: with "
             "local_sgd_period the strategy averages the replicas itself; give the loop the optimizer the ",
             optimizer.name(), " wraps, or drop local_sgd_period");
}

Tensor DistributedStrategy::train_step(const data::Batch& batch, const Criterion& criterion,
                                       optim::Optimizer& optimizer) {
  if (plan_.pipelined()) return pipeline_step(batch, criterion, optimizer);
  if (!averager_) return Strategy::train_step(batch, criterion, optimizer);
  check_local_sgd_optimizer(optimizer);
  // The hook counts this backward; the averager counts this step and averages on its schedule.
  Tensor loss = Strategy::train_step(batch, criterion, optimizer);
  std::optional<TraceSpan> span;  // only where this step averages
  if (averager_->averages_at(averager_->step())) span.emplace("average parameters", device_);
  averager_->average_parameters(params_);
  return loss;
}

Tensor DistributedStrategy::forward(const Tensor& input) {
  if (plan_.pipelined()) return broadcast_from_last_stage(pipeline().forward(input));
  return Strategy::forward(input);
}

void DistributedStrategy::consolidate_replicas(optim::Optimizer& optimizer) {
  if (plan_.pipelined()) gather_stages(optimizer);
  else average_local_sgd_replicas(optimizer);
}

void DistributedStrategy::average_local_sgd_replicas(optim::Optimizer& optimizer) {
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
  const std::vector<parallel::NamedValue> sizes{{"state tensors", count}, {"elements", elements}};
  if (auto difference = parallel::first_disagreement(*group_, sizes, device_))
    WEFT_FAIL("DistributedStrategy: local SGD cannot average the optimizers' states: rank ", rank(), "'s ",
              optimizer.name(), " holds ", count, " state tensors of ", elements, " elements; ", *difference,
              " (a parameter that has had a gradient on some ranks only?)");
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

// --- the data-parallel dimension ------------------------------------------------------

std::shared_ptr<data::DataLoader> DistributedStrategy::shard(std::shared_ptr<data::DataLoader> loader, bool training) {
  // A pipeline's ranks take every batch of their replica's shard; one replica takes them all.
  const int replicas = plan_.dp_replicate;
  if (plan_.pipelined() && replicas == 1) return loader;
  return shard_loader(*loader, training, replicas, mesh_->coordinate("dp_replicate"));
}

Totals DistributedStrategy::reduce(const Totals& local) {
  if (plan_.pipelined()) return reduce_over_pipelines(local);
  Tensor sums = tensor(std::vector<double>{local.loss, local.correct, local.samples, local.batches});
  if (!device_.is_cpu()) sums = sums.to(device_);
  group_->all_reduce(sums, parallel::ReduceOp::Sum)->wait();
  auto v = sums.to(kCPU).to_vector<double>();
  return {v[0], v[1], v[2], v[3]};
}

void DistributedStrategy::barrier() { group_->barrier()->wait(); }

// --- pp: a stage per rank -------------------------------------------------------------

std::shared_ptr<nn::Module> DistributedStrategy::prepare_pipeline(std::shared_ptr<nn::Module> model) {
  const PipelineAxisOptions& axis = options_.pipeline;
  pipeline_ = std::make_shared<parallel::pipeline::DistributedPipeline>(
      pipeline_sequential(model), pipeline_mesh_.pipeline,
      parallel::pipeline::DistributedPipelineOptions{.device = device_,
                                                     .balance = axis.balance,
                                                     .balance_by = axis.balance_by,
                                                     // replicas agree on the options, and share one balance
                                                     .job_group = pipeline_mesh_.replicas_group ? group_ : nullptr,
                                                     .replicas_group = pipeline_mesh_.replicas_group,
                                                     .micro_batches = axis.micro_batches,
                                                     .schedule = axis.schedule,
                                                     .virtual_stages = axis.virtual_stages,
                                                     .activation_checkpointing = axis.activation_checkpointing});
  for (int s = 0; s < pipeline_->num_stages(); ++s)
    for (const Tensor& p : pipeline_->stage(s).parameters()) owners_[p.impl()] = pipeline_->schedule().rank_of(s);
  return pipeline_;
}

parallel::pipeline::DistributedPipeline& DistributedStrategy::pipeline() const {
  WEFT_CHECK(pipeline_ != nullptr, kWho, ": pipeline() before prepare()");
  return *pipeline_;
}

int DistributedStrategy::owner_of(const Tensor& param) const {
  auto it = owners_.find(param.impl());
  return it == owners_.end() ? -1 : it->second;
}

std::vector<size_t> DistributedStrategy::stage_layers() const {
  return pipeline_ ? pipeline_->balance() : std::vector<size_t>{};
}

Tensor DistributedStrategy::pipeline_step(const data::Batch& batch, const Criterion& criterion,
                                          optim::Optimizer& optimizer) {
  WEFT_CHECK(optimizer.step_scope() == optim::StepScope::Local, kWho, ": the ", optimizer.name(),
             " works across the ranks of data parallelism; in a pipeline each "
             "rank steps its own stages, so give the loop the optimizer it wraps");
  auto& pipe = pipeline();
  optimizer.zero_grad();
  const parallel::pipeline::StepResult result = pipe.step(batch.data, batch.target, criterion);
  {
    TraceSpan span("optimizer step", device_);
    optimizer.step();
  }
  // Every rank adds the step's loss to its epoch's sum, as the main process logs it.
  NoGradGuard no_grad;
  Tensor loss = result.loss.defined() ? result.loss.detach().to(DType::Float64).contiguous()
                                      : zeros({}, TensorOptions(DType::Float64, device_));
  pipeline_mesh_.pipeline->broadcast(loss, pipe.schedule().rank_of(pipe.num_stages() - 1))->wait();
  return loss;
}

Tensor DistributedStrategy::broadcast_from_last_stage(const Tensor& t) const {
  const int root = pipeline_->schedule().rank_of(pipeline_->num_stages() - 1);
  // The root's header says -1 dims when it has no output to send, and every rank says so.
  const bool sendable = t.defined() && t.dim() <= parallel::pipeline::kMaxHeaderDims;
  const bool at_root = pipeline_mesh_.position == root;
  Tensor head = parallel::pipeline::tensor_header(at_root ? t : Tensor(), device_);
  pipeline_mesh_.pipeline->broadcast(head, root)->wait();
  const std::string who = std::string(kWho) + ": the last stage's output from pipeline rank " + std::to_string(root);
  std::optional<Tensor> out = at_root ? (sendable ? std::optional<Tensor>(t.contiguous()) : std::nullopt)
                                      : parallel::pipeline::empty_from_header(head, device_, who);
  WEFT_CHECK(out.has_value(), kWho, ": the model's output on pipeline rank ", root, " (the last stage's) must be a "
             "tensor of at most ", parallel::pipeline::kMaxHeaderDims, " dims",
             at_root ? ", got " + (t.defined() ? t.shape().str() : "none") : "");
  pipeline_mesh_.pipeline->broadcast(*out, root)->wait();
  return *out;
}

Totals DistributedStrategy::reduce_over_pipelines(const Totals& local) {
  // The counts are alike on every rank of a pipeline: the maximum and the minimum over it must
  // be them.
  const std::vector<double> counts{local.correct, local.samples, local.batches};
  const std::vector<parallel::ValueRange> ranges = parallel::value_ranges(*pipeline_mesh_.pipeline, counts, device_);
  std::string disagreement;  // this pipeline's ranks', said to each of them
  if (!std::all_of(ranges.begin(), ranges.end(), [](const parallel::ValueRange& r) { return r.agreed(); })) {
    std::ostringstream out;
    for (size_t k = 0; k < counts.size(); ++k)
      out << (k ? ", " : "") << counts[k] << " (from " << ranges[k].low << " to " << ranges[k].high << ")";
    disagreement = "the ranks of a pipeline disagree on counts they hold alike (correct, samples, batches): rank " +
                   std::to_string(rank()) + " has " + out.str() + " over its pipeline's ranks";
  }
  // Summed over the replicas (each its own samples); of the sums, the loss is the pipelines'
  // first ranks': the main process's started from the checkpoint's partial sum (train_loop.h),
  // the others' from 0. The last entry counts the pipelines that disagree: position 0's
  // replicas, one rank of every pipeline, add them up, and every rank fails together.
  Tensor sums = tensor(std::vector<double>{local.loss, local.correct, local.samples, local.batches,
                                           disagreement.empty() ? 0.0 : 1.0})
                    .to(device_);
  if (pipeline_mesh_.replicas_group) pipeline_mesh_.replicas_group->all_reduce(sums, parallel::ReduceOp::Sum)->wait();
  pipeline_mesh_.pipeline->broadcast(sums, 0)->wait();
  const std::vector<double> v = sums.to(kCPU).to_vector<double>();
  const char* why = ". Every rank must run the same batches from the same point: the same loaders and seed, resumed "
                    "from the same checkpoint";
  WEFT_CHECK(disagreement.empty(), kWho, ": ", disagreement, why);
  WEFT_CHECK(v[4] == 0, kWho, ": the ranks of ", v[4], v[4] == 1 ? " other pipeline" : " other pipelines",
             " disagree on the counts of their batches (their errors say how)", why);
  return {v[0], v[1], v[2], v[3]};
}

void DistributedStrategy::gather_stages(optim::Optimizer& optimizer) {
  TraceSpan span("gather stages", device_);
  pipeline().broadcast_stages();  // with replicas, replica 0's buffers too
  // This rank's entries of the optimizer's state: those of the parameters it steps, and the
  // hyperparameters. An optimizer over parameters that are not the model's is a problem every
  // rank hears of.
  const optim::OptimizerState state = optimizer.state_dict();
  const std::vector<Tensor>& params = optimizer.params();
  std::string problem;
  for (size_t i = 0; i < params.size() && problem.empty(); ++i)
    if (owner_of(params[i]) < 0)
      problem = "parameter " + std::to_string(i) + " of the " + optimizer.name() + " (" +
                params[i].shape().str() + ") is not one of the pipeline's model's";
  auto mine = [&](const std::string& key) {
    auto split = parallel::split_state_key(key);
    if (split && split->first >= params.size() && problem.empty())
      problem = "the " + optimizer.name() + "'s state entry '" + key + "' names no parameter (it has " +
                std::to_string(params.size()) + ")";
    return !split ||
           (split->first < params.size() && owner_of(params[split->first]) == pipeline_mesh_.pipeline->rank());
  };
  optim::OptimizerState own;
  for (const auto& [key, t] : state.tensors)
    if (mine(key)) own.tensors.emplace_back(key, t);
  for (const auto& [key, value] : state.scalars)
    if (mine(key)) own.scalars[key] = value;
  const optim::OptimizerState whole = parallel::gather_optimizer_state(
      *pipeline_mesh_.pipeline, own, std::nullopt, device_, std::string(kWho) + ".consolidate_replicas", problem);
  optimizer.load_state_dict(whole);
}

}  // namespace weft::train
