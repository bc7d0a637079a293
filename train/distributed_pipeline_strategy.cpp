// DistributedPipelineStrategy: a stage per rank, the loss and outputs broadcast from the last
// stage's, the stages and the optimizer's state gathered for checkpoints.
#include "train/distributed_pipeline_strategy.h"

#include <optional>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/distributed.h"
#include "parallel/optimizer_state_gather.h"
#include "parallel/pipeline/tensor_header.h"
#include "parallel/post_localsgd_optimizer.h"
#include "parallel/zero_redundancy_optimizer.h"
#include "train/launch.h"
#include "train/pipeline_strategy.h"

namespace weft::train {

namespace {

constexpr const char* kWho = "DistributedPipelineStrategy";

// What prepare() returned, which the loop hands back.
parallel::pipeline::DistributedPipeline& as_pipeline(nn::Module& model) {
  auto* pipe = dynamic_cast<parallel::pipeline::DistributedPipeline*>(&model);
  WEFT_CHECK(pipe != nullptr, kWho, ": expected the DistributedPipeline that prepare() made, got a ",
             model.type_name());
  return *pipe;
}

}  // namespace

DistributedPipelineStrategy::DistributedPipelineStrategy(DistributedPipelineStrategyOptions options)
    : options_(std::move(options)) {
  device_ = join_job(options_.device, options_.backend);
  group_ = parallel::default_group_ptr();
  mesh_ = parallel::pipeline::pipeline_mesh(options_.replicas);
}

std::shared_ptr<nn::Module> DistributedPipelineStrategy::prepare(std::shared_ptr<nn::Module> model) {
  pipeline_ = std::make_shared<parallel::pipeline::DistributedPipeline>(
      pipeline_sequential(model), mesh_.pipeline,
      parallel::pipeline::DistributedPipelineOptions{.device = device_,
                                                     .balance = options_.balance,
                                                     .balance_by = options_.balance_by,
                                                     // replicas agree on the options, and share one balance
                                                     .job_group = mesh_.replicas_group ? group_ : nullptr,
                                                     .replicas_group = mesh_.replicas_group,
                                                     .micro_batches = options_.micro_batches,
                                                     .schedule = options_.schedule,
                                                     .virtual_stages = options_.virtual_stages,
                                                     .activation_checkpointing = options_.activation_checkpointing});
  for (int s = 0; s < pipeline_->num_stages(); ++s)
    for (const Tensor& p : pipeline_->stage(s).parameters()) owners_[p.impl()] = pipeline_->schedule().rank_of(s);
  return pipeline_;
}

std::shared_ptr<data::DataLoader> DistributedPipelineStrategy::shard(std::shared_ptr<data::DataLoader> loader,
                                                                      bool training) {
  if (mesh_.replicas == 1) return loader;
  return shard_loader(*loader, training, mesh_.replicas, mesh_.replica);
}

parallel::pipeline::DistributedPipeline& DistributedPipelineStrategy::pipeline() const {
  WEFT_CHECK(pipeline_ != nullptr, kWho, ": pipeline() before prepare()");
  return *pipeline_;
}

int DistributedPipelineStrategy::owner_of(const Tensor& param) const {
  auto it = owners_.find(param.impl());
  return it == owners_.end() ? -1 : it->second;
}

Tensor DistributedPipelineStrategy::train_step(nn::Module& model, const data::Batch& batch,
                                               const Criterion& criterion, optim::Optimizer& optimizer) {
  WEFT_CHECK(dynamic_cast<const parallel::ZeroRedundancyOptimizer*>(&optimizer) == nullptr &&
                 dynamic_cast<const parallel::PostLocalSGDOptimizer*>(&optimizer) == nullptr,
             kWho, ": the ", optimizer.name(), " works across the ranks of data parallelism; in a pipeline each "
             "rank steps its own stages, so give the loop the optimizer it wraps");
  auto& pipe = as_pipeline(model);
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
  mesh_.pipeline->broadcast(loss, pipe.schedule().rank_of(pipe.num_stages() - 1))->wait();
  return loss;
}

Tensor DistributedPipelineStrategy::forward(nn::Module& model, const Tensor& input) {
  return broadcast_from_last_stage(as_pipeline(model).forward(input));
}

Tensor DistributedPipelineStrategy::broadcast_from_last_stage(const Tensor& t) const {
  const int root = pipeline_->schedule().rank_of(pipeline_->num_stages() - 1);
  // The root's header says -1 dims when it has no output to send, and every rank says so.
  const bool sendable = t.defined() && t.dim() <= parallel::pipeline::kMaxHeaderDims;
  const bool at_root = mesh_.position == root;
  Tensor head = parallel::pipeline::tensor_header(at_root ? t : Tensor(), device_);
  mesh_.pipeline->broadcast(head, root)->wait();
  const std::string who = std::string(kWho) + ": the last stage's output from pipeline rank " + std::to_string(root);
  std::optional<Tensor> out = at_root ? (sendable ? std::optional<Tensor>(t.contiguous()) : std::nullopt)
                                      : parallel::pipeline::empty_from_header(head, device_, who);
  WEFT_CHECK(out.has_value(), kWho, ": the model's output on pipeline rank ", root, " (the last stage's) must be a "
             "tensor of at most ", parallel::pipeline::kMaxHeaderDims, " dims",
             at_root ? ", got " + (t.defined() ? t.shape().str() : "none") : "");
  mesh_.pipeline->broadcast(*out, root)->wait();
  return *out;
}

Totals DistributedPipelineStrategy::reduce(const Totals& local) {
  // The counts are alike on every rank of a pipeline: the maximum and the minimum over it must
  // be them.
  const std::vector<double> counts{local.correct, local.samples, local.batches};
  std::vector<double> both = counts;
  for (double v : counts) both.push_back(-v);
  Tensor extremes = tensor(both).to(device_);
  mesh_.pipeline->all_reduce(extremes, parallel::ReduceOp::Max)->wait();
  const std::vector<double> e = extremes.to(kCPU).to_vector<double>();
  std::string disagreement;  // this pipeline's ranks', said to each of them
  for (size_t i = 0; i < counts.size() && disagreement.empty(); ++i) {
    if (e[i] == -e[i + counts.size()]) continue;
    std::ostringstream out;
    for (size_t k = 0; k < counts.size(); ++k)
      out << (k ? ", " : "") << counts[k] << " (from " << -e[k + counts.size()] << " to " << e[k] << ")";
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
  if (mesh_.replicas_group) mesh_.replicas_group->all_reduce(sums, parallel::ReduceOp::Sum)->wait();
  mesh_.pipeline->broadcast(sums, 0)->wait();
  const std::vector<double> v = sums.to(kCPU).to_vector<double>();
  const char* why = ". Every rank must run the same batches from the same point: the same loaders and seed, resumed "
                    "from the same checkpoint";
  WEFT_CHECK(disagreement.empty(), kWho, ": ", disagreement, why);
  WEFT_CHECK(v[4] == 0, kWho, ": the ranks of ", v[4], v[4] == 1 ? " other pipeline" : " other pipelines",
             " disagree on the counts of their batches (their errors say how)", why);
  return {v[0], v[1], v[2], v[3]};
}

void DistributedPipelineStrategy::barrier() { group_->barrier()->wait(); }

void DistributedPipelineStrategy::consolidate_replicas(optim::Optimizer& optimizer) {
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
    return !split || (split->first < params.size() && owner_of(params[split->first]) == mesh_.pipeline->rank());
  };
  optim::OptimizerState own;
  for (const auto& [key, t] : state.tensors)
    if (mine(key)) own.tensors.emplace_back(key, t);
  for (const auto& [key, value] : state.scalars)
    if (mine(key)) own.scalars[key] = value;
  const optim::OptimizerState whole = parallel::gather_optimizer_state(
      *mesh_.pipeline, own, std::nullopt, device_, std::string(kWho) + ".consolidate_replicas", problem);
  optimizer.load_state_dict(whole);
}

}  // namespace weft::train
