// What the scenarios of ddp_worker (ddp_worker*.cpp) share: failure reporting, the
// models, optimizers and batches every rank can rebuild, and the comparison of a replica's
// tensors with the single-process reference's.
#pragma once

#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <weft.h>

#include "worker_backend.h"

namespace weft::ddp_worker {

inline int failures = 0;

inline std::string backend() { return test::worker_backend(); }
inline Device device() { return test::worker_device(); }
inline void fail(const std::string& what) {
  std::cout << "FAIL: rank " << parallel::get_rank() << ": " << what << std::endl;
  ++failures;
}

// "gpt": a small GPT with its tied embedding (nn/models/gpt.h); its samples are token windows.
inline std::shared_ptr<nn::Module> make_model(const std::string& name) {
  Generator gen(7);
  std::shared_ptr<nn::Module> m;
  if (name == "convnet") m = std::make_shared<nn::ConvNet>(10, &gen);
  else if (name == "gpt")
    m = std::make_shared<nn::GPT>(nn::GPTConfig{.vocab_size = 13, .block_size = 6, .n_layer = 2, .n_head = 2,
                                                .n_embd = 8},
                                  TensorOptions{}, &gen);
  else if (name == "resnet") m = std::make_shared<nn::ResNet>(1, 10, std::vector<int64_t>{1, 1, 1}, &gen);
  else if (name == "linear") m = std::make_shared<nn::Linear>(20, 10, true, TensorOptions{}, &gen);  // 2 parameters
  else m = std::make_shared<nn::MLP>(20, std::vector<int64_t>{16, 12}, 10, 0.0, &gen);
  m->to(DType::Float64);
  m->to(device());
  if (name == "resnet") m->eval();  // BatchNorm on running statistics: what DDP matches (Note in test_ddp.cpp)
  return m;
}

// A GPT's is empty: batch() makes token windows for it.
inline Shape sample_shape(const std::string& model) {
  if (model == "gpt") return Shape{};
  return model == "mlp" || model == "linear" ? Shape{20} : model == "resnet" ? Shape{1, 12, 12} : Shape{1, 28, 28};
}

// What a model's training minimises: a GPT's next-token loss, the classifiers' cross-entropy.
inline Tensor model_loss(const std::string& model, const Tensor& output, const Tensor& target) {
  return model == "gpt" ? nn::next_token_loss(output, target) : cross_entropy(output, target);
}

// "sgd" (with momentum), "adam" or "adamw-groups" (nanoGPT's: matrices decay, the rest does
// not; the groups keep the order of `params`); "zero-sgd", "zero-adam" and
// "zero-adamw-groups": the same sharded over the default group by a ZeroRedundancyOptimizer
// (every rank must make it at the same point).
inline std::shared_ptr<optim::Optimizer> make_optimizer(const std::string& name, const std::vector<Tensor>& params) {
  if (name.rfind("zero-", 0) == 0) {
    const std::string plain = name.substr(5);
    return std::make_shared<parallel::ZeroRedundancyOptimizer>(
        params, [plain](std::vector<Tensor> shard) { return make_optimizer(plain, shard); });
  }
  if (name == "adam") return std::make_shared<optim::Adam>(params, optim::AdamOptions{0.01});
  if (name == "adamw-groups") {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const Tensor& p : params) named.emplace_back(std::to_string(named.size()), p);
    return std::make_shared<optim::AdamW>(optim::restrict_groups(optim::weight_decay_groups(named, 0.1), params),
                                          optim::AdamWOptions(0.01, {0.9, 0.95}));
  }
  return std::make_shared<optim::SGD>(params, optim::SGDOptions{0.05, 0.9});
}
// The optimizer a single-process reference uses for `name`: without "zero-".
inline std::string unsharded(const std::string& name) { return name.rfind("zero-", 0) == 0 ? name.substr(5) : name; }

// The global batch of step s: ranks * per_rank samples.
inline std::pair<Tensor, Tensor> batch(int step, int64_t rows, const Shape& sample) {
  if (sample.empty()) {  // a GPT's: token windows of 6, next-token targets
    Generator gen(1000 + step);
    return {randint(0, 13, {rows, 6}, DType::Int64, &gen).to(device()),
            randint(0, 13, {rows, 6}, DType::Int64, &gen).to(device())};
  }
  Generator gen(1000 + step);
  Shape shape = sample;
  shape.insert(0, rows);
  return {randn(shape, TensorOptions(DType::Float64), &gen).to(device()),
          randint(0, 10, {rows}, DType::Int64, &gen).to(device())};
}

// `steps` steps of the reference on the whole batch of each step and of the DDP replica on
// this rank's b rows of it.
inline void train_side_by_side(nn::Module& reference, optim::Optimizer& opt_ref, nn::Module& ddp,
                               optim::Optimizer& opt_ddp, const std::string& model, int steps, int64_t b) {
  const int rank = parallel::get_rank(), world = parallel::get_world_size();
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step, world * b, sample_shape(model));
    opt_ref.zero_grad();
    model_loss(model, reference.forward(x), y).backward();
    opt_ref.step();
    opt_ddp.zero_grad();
    model_loss(model, ddp(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
    opt_ddp.step();
  }
}

inline bool close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol, std::string* where) {
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k)
      if (!(std::fabs(x[k] - y[k]) <= 1e-12 + rtol * std::fabs(y[k]))) {
        std::ostringstream out;
        out << "tensor " << i << " element " << k << ": " << x[k] << " vs " << y[k];
        *where = out.str();
        return false;
      }
  }
  return true;
}

// ddp_worker_hooks.cpp: the allreduce, fp16 and bf16 communication hooks, PowerSGD's.
int scenario_comm_hook(const std::string& hook, bool bucket_view);
int scenario_powersgd(int64_t approximation_rank, int64_t per_rank_batch);
// The scenarios of ddp_worker_training.cpp: SyncBatchNorm and the TrainLoop's ddp mode.
int scenario_sync_bn(const std::string& optimizer);
int scenario_sync_bn_uneven();
int scenario_elastic(const std::string& phase, const std::string& optimizer, const std::string& checkpoint,
                     int ranks_before);
int scenario_elastic_local_sgd(const std::string& phase, const std::string& optimizer, const std::string& checkpoint,
                               int ranks_before);
int scenario_local_sgd_buffers();
// ddp_worker_zero.cpp: ZeroRedundancyOptimizer under DDP.
int scenario_zero(const std::string& model, const std::string& optimizer);
int scenario_zero_checkpoint(const std::string& model, const std::string& optimizer);
int scenario_zero_mismatch();
// ddp_worker_join.cpp: uneven inputs inside parallel::join.
int scenario_join(const std::string& model, const std::string& optimizer, const std::string& counts,
                  const std::vector<std::string>& flags);
int scenario_join_throw(const std::string& counts);
// ddp_worker_local_sgd.cpp: the post-local SGD hook with model averagers.
int scenario_local_sgd(const std::string& optimizer, int64_t start, const std::string& averager,
                       const std::string& subgroup, const std::vector<std::string>& flags);

}  // namespace weft::ddp_worker
