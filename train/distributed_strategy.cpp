// DistributedStrategy: join the group, wrap in DDP, shard the loaders, all-reduce the sums.
#include "train/distributed_strategy.h"

#include <algorithm>
#include <iostream>

#include "core/error.h"
#include "data/sampler.h"
#include "parallel/comm_hooks.h"
#include "parallel/distributed.h"
#include "parallel/launch_env.h"
#include "parallel/sync_batch_norm.h"

namespace weft::train {

DistributedStrategy::DistributedStrategy(DistributedStrategyOptions options) : options_(std::move(options)) {
  if (options_.device) {
    device_ = *options_.device;
  } else if (cuda_available()) {
    const int local = parallel::launched_as_rank() ? parallel::read_launch_env().local_rank : 0;
    device_ = Device::cuda(local % cuda_device_count());
  } else {
    device_ = kCPU;
  }
  if (!parallel::is_initialized()) {
    const std::string backend = !options_.backend.empty() ? options_.backend : device_.is_cuda() ? "nccl" : "gloo";
    parallel::init_process_group(backend);
  }
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
  return ddp_;
}

parallel::DistributedDataParallel& DistributedStrategy::ddp() const {
  WEFT_CHECK(ddp_ != nullptr, "DistributedStrategy: ddp() before prepare()");
  return *ddp_;
}

std::shared_ptr<data::DataLoader> DistributedStrategy::shard(std::shared_ptr<data::DataLoader> loader, bool training) {
  const int64_t n = static_cast<int64_t>(loader->dataset()->size());
  data::DataLoaderOptions options = loader->options();
  std::shared_ptr<data::Sampler> sampler;
  if (training) {
    sampler = std::make_shared<data::DistributedSampler>(n, world_size(), rank(), options.shuffle, options.seed);
  } else {
    sampler = std::make_shared<data::DistributedEvalSampler>(n, world_size(), rank());
  }
  options.shuffle = false;  // the sampler shuffles
  return std::make_shared<data::DataLoader>(loader->dataset(), options, std::move(sampler));
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
