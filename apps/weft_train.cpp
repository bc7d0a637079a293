// weft-train: the main job. Trains a model on Fashion-MNIST (or synthetic data), or a GPT on
// text, with the TrainLoop, on the GPU when there is one, else on the CPU.
//
//   weft-train --model convnet --optimizer sgd --lr 0.01 --momentum 0.9 --batch-size 100 \
//              --epochs 3 --device cpu --seed 0
//   weft-train --model gpt --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --data text
//
// A GPT trains on bytes (data/text_dataset.h: the fortunes corpus by default) with nanoGPT's
// recipe unless flags say otherwise: AdamW with weight decay 0.1 on matrices and embeddings
// only (optim::weight_decay_groups), lr 1e-3 warmed up over --warmup-steps then cosine-decayed
// to a tenth over the run's steps, and ends by printing a sample of --sample-tokens bytes.
//
// --metrics-json writes model, test_accuracy, final_loss, images_per_second, epochs,
// world_size, mode and device at the end (a GPT: val_loss, val_accuracy, unigram_loss,
// tokens_per_second and parameters too); bench/reference/train_convnet.py writes the same for
// PyTorch.
//
// As a worker of an elastic job (WEFT_ELASTIC=1, set by weft-run's agent) it resumes from its
// --checkpoint when that exists, so that every restart goes on where the job was
// (train/elastic.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include <weft.h>

#include "apps/flag_checks.h"
#include "core/atomic_file.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "nn/loss.h"
#include "data/text_dataset.h"
#include "nn/models/convnet.h"
#include "nn/models/gpt.h"
#include "nn/models/mlp.h"
#include "nn/models/resnet.h"
#include "nn/optim/adam.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/param_group.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"
#include "parallel/local/data_parallel.h"
#include "parallel/optim/zero_redundancy_optimizer.h"
#include "train/data_parallel_strategy.h"
#include "train/distributed_strategy.h"
#include "train/elastic.h"
#include "train/launch.h"
#include "train/pipeline_strategy.h"
#include "train/train_loop.h"

using namespace weft;

namespace {

struct Config {
  std::string model = "convnet", data = "fashion-mnist", data_dir = "/usr/share/datasets/fashion-mnist";
  std::string device, devices, optimizer = "sgd", mode = "single", checkpoint, resume, metrics_json, trace;
  std::string lr_schedule = "constant";
  int64_t checkpoint_every = 0;  // 0: checkpoints at epochs' ends only
  int64_t local_sgd = 0, local_sgd_warmup = 0;  // --local-sgd's period (0: plain DDP) and warm-up
  int epochs = 3, workers = 0, nproc = 0, nnodes = 1, node_rank = 0, master_port = 0;
  int microbatches = 4, virtual_stages = 0;  // 0: 2 with the interleaved schedule, else 1
  int replicas = 1;  // --mode pipeline across processes: pipelines side by side, each its share of the data
  std::string schedule = "1f1b";
  std::string balance;  // --balance: layers per stage ("1,3"), "time", or "" (by layer count)
  std::string activation_checkpointing = "never";
  std::string comm_hook = "allreduce";
  std::string master_addr;
  int64_t batch_size = 100;
  double lr = 0.01, momentum = 0.9;
  std::optional<double> weight_decay;  // unset: the optimizer's own default (AdamW: 1e-2)
  uint64_t seed = 0;
  bool no_progress = false, sync_bn = false, zero = false;
  // --model gpt (nn/models/gpt.h); tie_embeddings unset: tied, except in pipelines, whose
  // stages cannot share the embedding with the head.
  int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, warmup_steps = 100;
  int64_t lr_decay_steps = 0;  // warmup-cosine's length; 0: the run's steps
  double dropout = 0;
  std::optional<bool> tie_embeddings;
  int64_t sample_tokens = 200, top_k = 40;  // top_k 0: sample from every token
  double temperature = 0.8;
  std::set<std::string> given;  // the flags on the command line, without their "--"
  std::set<std::string> recorded;  // the run flags a resumed run took from its checkpoint
  // Whether `flag` was chosen, on the command line or by the run being resumed.
  bool chosen(const std::string& flag) const { return given.count(flag) || recorded.count(flag); }
  bool is_gpt() const { return model == "gpt"; }
  bool ties_embeddings() const { return tie_embeddings.value_or(mode != "pipeline"); }
};

// Data-loader threads beyond this only contend for the cores (and thousands fail to start).
constexpr int kMaxWorkers = 64;

double weight_decay_of(const Config& c) {
  if (c.weight_decay) return *c.weight_decay;
  if (c.is_gpt()) return 0.1;  // nanoGPT's, on the groups that decay
  if (c.optimizer == "adam") return optim::AdamOptions{}.weight_decay;
  if (c.optimizer == "adamw") return optim::AdamWOptions{}.weight_decay;
  return optim::SGDOptions{}.weight_decay;
}

// The shortest text that reads back as the same double ("0.1", not "0.10000000000000001").
std::string exact(double v) {
  char buffer[40];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, end);
}

double parse_exact(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

// The flags that define a run, recorded in its checkpoints as "weft-train.<flag>". A resumed
// run goes on with them: a flag left out takes the checkpoint's value, one given with another
// value is refused (the run would no longer be the one resumed, nor its resume identical to
// a run without the break). --lr is the exception: a new value replaces the checkpoint's, with
// a note, since a lower learning rate is how a diverged or stalled run goes on.
struct RunFlag {
  const char* name;
  std::function<std::string(const Config&)> get;
  std::function<void(Config&, const std::string&)> set;
  bool gpt_only = false;  // recorded for --model gpt only
};

// In this order: weight decay's default depends on the optimizer, settled before it.
const std::vector<RunFlag>& run_flags() {
  static const std::vector<RunFlag> flags{
      {"model", [](const Config& c) { return c.model; }, [](Config& c, const std::string& v) { c.model = v; }},
      {"data", [](const Config& c) { return c.data; }, [](Config& c, const std::string& v) { c.data = v; }},
      {"optimizer", [](const Config& c) { return c.optimizer; },
       [](Config& c, const std::string& v) { c.optimizer = v; }},
      {"seed", [](const Config& c) { return std::to_string(c.seed); },
       [](Config& c, const std::string& v) { c.seed = std::stoull(v); }},
      {"batch-size", [](const Config& c) { return std::to_string(c.batch_size); },
       [](Config& c, const std::string& v) { c.batch_size = std::stoll(v); }},
      {"momentum", [](const Config& c) { return exact(c.momentum); },
       [](Config& c, const std::string& v) { c.momentum = parse_exact(v); }},
      {"weight-decay", [](const Config& c) { return exact(weight_decay_of(c)); },
       [](Config& c, const std::string& v) { c.weight_decay = parse_exact(v); }},
      {"lr-schedule", [](const Config& c) { return c.lr_schedule; },
       [](Config& c, const std::string& v) { c.lr_schedule = v; }},
      {"local-sgd", [](const Config& c) { return std::to_string(c.local_sgd); },
       [](Config& c, const std::string& v) { c.local_sgd = std::stoll(v); }},
      {"local-sgd-warmup", [](const Config& c) { return std::to_string(c.local_sgd_warmup); },
       [](Config& c, const std::string& v) { c.local_sgd_warmup = std::stoll(v); }},
      // The GPT's shape: a checkpoint loads only into the model it was saved from.
      {"n-layer", [](const Config& c) { return std::to_string(c.n_layer); },
       [](Config& c, const std::string& v) { c.n_layer = std::stoll(v); }, true},
      {"n-head", [](const Config& c) { return std::to_string(c.n_head); },
       [](Config& c, const std::string& v) { c.n_head = std::stoll(v); }, true},
      {"n-embd", [](const Config& c) { return std::to_string(c.n_embd); },
       [](Config& c, const std::string& v) { c.n_embd = std::stoll(v); }, true},
      {"block-size", [](const Config& c) { return std::to_string(c.block_size); },
       [](Config& c, const std::string& v) { c.block_size = std::stoll(v); }, true},
      {"dropout", [](const Config& c) { return exact(c.dropout); },
       [](Config& c, const std::string& v) { c.dropout = parse_exact(v); }, true},
      {"tie-embeddings", [](const Config& c) { return std::string(c.ties_embeddings() ? "true" : "false"); },
       [](Config& c, const std::string& v) { c.tie_embeddings = v == "true"; }, true},
  };
  return flags;
}

std::map<std::string, std::string> run_record(const Config& c) {
  std::map<std::string, std::string> record;
  for (const RunFlag& f : run_flags())
    if (!f.gpt_only || c.is_gpt()) record["weft-train." + std::string(f.name)] = f.get(c);
  return record;
}

// Resuming: takes the checkpoint's run flags where the command line left them out, and
// refuses one given with another value. A checkpoint without a record (written by a
// TrainLoop of another program) is not checked.
void continue_recorded_run(Config& c, bool main_process) {
  const std::map<std::string, std::string> meta = load_safetensors_metadata(c.resume);
  if (!meta.count("weft-train.model")) {
    if (main_process)
      std::cout << "weft-train: '" << c.resume << "' does not record weft-train's flags; they are not checked\n";
    return;
  }
  for (const RunFlag& f : run_flags()) {
    auto it = meta.find("weft-train." + std::string(f.name));
    if (it == meta.end()) continue;
    const std::string mine = f.get(c);
    if (!c.given.count(f.name)) {
      f.set(c, it->second);
      c.recorded.insert(f.name);
    } else {
      WEFT_CHECK(mine == it->second, "--", f.name, " ", mine, " differs from the run being resumed ('", c.resume,
                 "' has --", f.name, " ", it->second, "); leave --", f.name,
                 " out to go on with the checkpoint's, or start a new run without --resume");
    }
  }
}

// Images with a class-dependent pattern plus noise: learnable, and needs no files.
std::shared_ptr<data::Dataset> synthetic(int64_t n, uint64_t seed) {
  Generator gen(seed);
  Generator prototypes_gen(1234);  // the same classes for train and test
  Tensor prototypes = randn({10, 1, 28, 28}, DType::Float32, &prototypes_gen);
  Tensor labels = randint(0, 10, {n}, DType::Int64, &gen);
  Tensor images = add(index_select(prototypes, 0, labels), mul(randn({n, 1, 28, 28}, DType::Float32, &gen), 2.0));
  return std::make_shared<data::TensorDataset>(images, labels);
}

// --model gpt's defaults where neither the command line nor the run being resumed chose:
// nanoGPT's recipe (the header says which).
void settle_model_defaults(Config& c) {
  if (!c.is_gpt()) {
    WEFT_CHECK(c.data.rfind("text", 0) != 0, "--data ", c.data, " is for --model gpt (", c.model,
               " trains on images: fashion-mnist or synthetic)");
    for (const char* flag : {"n-layer", "n-head", "n-embd", "block-size", "dropout", "tie-embeddings", "sample-tokens",
                             "temperature", "top-k"})
      WEFT_CHECK(!c.given.count(flag), "--", flag, " is for --model gpt (this run trains a ", c.model, ")");
  } else {
    if (!c.chosen("data")) c.data = "text";
    WEFT_CHECK(c.data.rfind("text", 0) == 0, "--model gpt trains on text: --data text or text:PATH, got --data ",
               c.data);
    if (!c.chosen("optimizer")) c.optimizer = "adamw";
    if (!c.given.count("lr")) c.lr = 1e-3;
    if (!c.chosen("lr-schedule")) c.lr_schedule = "warmup-cosine";
    // A pipeline puts the embedding and the head on different stages, which cannot share a weight.
    if (c.mode == "pipeline" && c.ties_embeddings())
      WEFT_FAIL(c.recorded.count("tie-embeddings")
                    ? "'" + c.resume + "' is a GPT whose head is tied to its token embedding, which --mode pipeline "
                          "cannot split (its first and last stages would share one weight): resume it with --mode "
                          "single, dp or ddp, or start the pipeline's run afresh (a pipeline's GPT is untied)"
                    : std::string("--tie-embeddings true: --mode pipeline cannot split a GPT whose head is tied to its "
                                  "token embedding (its first and last stages would share one weight); leave it out "
                                  "(a pipeline's GPT is untied)"));
  }
  for (const char* flag : {"warmup-steps", "lr-decay-steps"})
    WEFT_CHECK(!c.given.count(flag) || c.lr_schedule == "warmup-cosine", "--", flag,
               " is for --lr-schedule warmup-cosine (this run's is ", c.lr_schedule, ")");
}

// "text" reads the default corpus; "text:PATH" a file or a folder of text files.
std::string text_path(const Config& c) {
  return c.data.size() > 5 && c.data[4] == ':' ? c.data.substr(5) : std::string(data::kDefaultTextCorpus);
}

nn::GPTConfig gpt_config(const Config& c) {
  return {.vocab_size = data::kTextVocabSize, .block_size = c.block_size, .n_layer = c.n_layer,
          .n_head = c.n_head, .n_embd = c.n_embd, .dropout = c.dropout, .tie_embeddings = c.ties_embeddings()};
}

std::shared_ptr<nn::Module> make_model(const Config& c) {
  if (c.model == "convnet") return std::make_shared<nn::ConvNet>();
  if (c.model == "mlp") return std::make_shared<nn::MLP>();
  if (c.is_gpt()) return std::make_shared<nn::GPT>(gpt_config(c));
  return std::make_shared<nn::ResNet>();
}

// --lr-schedule: cosine anneals from --lr to 0 over --epochs (the first run's: a resumed run's
// T_max comes from its checkpoint); step halves the rate after every epoch (StepLR, step_size 1,
// gamma 0.5), which needs no length and suits short runs; both step after each epoch.
// warmup-cosine steps after each optimizer step: --warmup-steps of linear warm-up, then a
// cosine decay to lr / 10 at step --lr-decay-steps (default: the run's last, steps_per_epoch x
// --epochs). Like cosine's, a resumed run's schedule is its checkpoint's.
std::shared_ptr<optim::LRScheduler> make_scheduler(const Config& c, optim::Optimizer& optimizer,
                                                   int64_t steps_per_epoch, bool main_process) {
  if (c.lr_schedule == "cosine") return std::make_shared<optim::CosineAnnealingLR>(optimizer, c.epochs);
  if (c.lr_schedule == "step") return std::make_shared<optim::StepLR>(optimizer, 1, 0.5);
  if (c.lr_schedule == "warmup-cosine") {
    const int64_t total =
        std::max<int64_t>(c.lr_decay_steps > 0 ? c.lr_decay_steps : steps_per_epoch * c.epochs, 1);
    const int64_t warmup = std::min(c.warmup_steps, total - 1);  // the cosine needs a step at least
    if (warmup < c.warmup_steps && main_process)
      std::cout << "weft-train: --warmup-steps " << c.warmup_steps << " is not below the schedule's " << total
                << " steps; warming up over " << warmup << " of them\n";
    return std::make_shared<optim::WarmupCosineLR>(optimizer, warmup, total, c.lr / 10);
  }
  return nullptr;
}

// The optimizer's parameter groups: a GPT's decay on matrices and embeddings only (nanoGPT's
// split), every other model's all alike.
std::vector<optim::ParamGroup> param_groups(const Config& c, const nn::Module& model) {
  if (c.is_gpt()) return optim::weight_decay_groups(model, weight_decay_of(c));
  return {optim::ParamGroup{model.parameters(), std::nullopt}};
}

// --zero: the same optimizer over each rank's shard of the parameters (with each parameter's
// group), in the job's group.
std::shared_ptr<optim::Optimizer> make_optimizer(const Config& c, const std::vector<optim::ParamGroup>& groups) {
  if (c.zero) {
    Config plain = c;
    plain.zero = false;
    return std::make_shared<parallel::ZeroRedundancyOptimizer>(
        optim::params_of(groups), [plain, groups](std::vector<Tensor> shard) {
          return make_optimizer(plain, optim::restrict_groups(groups, shard));
        });
  }
  if (c.optimizer == "sgd") {
    optim::SGDOptions o;
    o.lr = c.lr;
    o.momentum = c.momentum;
    o.weight_decay = weight_decay_of(c);
    return std::make_shared<optim::SGD>(groups, o);
  }
  if (c.optimizer == "adam") {
    optim::AdamOptions o;
    o.lr = c.lr;
    o.weight_decay = weight_decay_of(c);
    return std::make_shared<optim::Adam>(groups, o);
  }
  optim::AdamWOptions o;
  o.lr = c.lr;
  o.weight_decay = weight_decay_of(c);
  return std::make_shared<optim::AdamW>(groups, o);
}

// Whether this process is one rank of a job that trains across processes: ddp always; the
// pipeline when started as ranks (by --nproc, weft-run, torchrun, srun or mpirun), a stage each.
bool across_processes(train::ParallelMode mode) {
  return mode == train::ParallelMode::DistributedDataParallel ||
         (mode == train::ParallelMode::Pipeline && parallel::launched_as_rank());
}

// The devices the mode runs on: --device for single; across processes (ddp, or the pipeline
// started as ranks) this rank's (--device, else cuda:LOCAL_RANK with GPUs, else the CPU); for
// dp and the pipeline in one process, --devices, else every logical CUDA device, else (no GPU)
// two logical CPU devices.
std::vector<Device> pick_devices(const Config& c, train::ParallelMode mode) {
  if (mode == train::ParallelMode::Single) {
    WEFT_CHECK(c.devices.empty(), "--devices is for --mode dp or pipeline (use --device for one device)");
    return {Device(c.device.empty() ? (cuda_available() ? "cuda" : "cpu") : c.device)};
  }
  if (across_processes(mode)) {
    WEFT_CHECK(c.devices.empty(), "--mode ", c.mode, mode == train::ParallelMode::Pipeline ? " across processes" : "",
               " runs one process per device: choose how many with --nproc (each rank takes cuda:LOCAL_RANK, or the "
               "CPU), not --devices");
    if (!c.device.empty()) return {Device(c.device)};
    if (!cuda_available()) return {kCPU};
    return {Device::cuda(parallel::read_launch_env().local_rank % cuda_device_count())};
  }
  WEFT_CHECK(c.device.empty(), "--mode ", c.mode, " takes --devices (a list such as cpu:0,cpu:1), not --device");
  if (!c.devices.empty()) return parallel::parse_device_list(c.devices);
  if (cuda_available()) {
    std::vector<Device> all;
    for (int i = 0; i < cuda_device_count(); ++i) all.push_back(Device::cuda(i));
    return all;
  }
  std::cout << "weft-train: no GPU, so --mode " << c.mode << " runs on cpu:0,cpu:1 (choose with --devices)\n";
  return {Device("cpu:0"), Device("cpu:1")};
}

// --balance as the pipelines take it: a list of layers per stage, or (time) a Balancer that
// times the layers on one micro-batch of the training set's first samples.
std::vector<size_t> balance_list(const Config& c) {
  std::vector<size_t> counts;
  if (c.balance.empty() || c.balance == "time") return counts;
  std::istringstream in(c.balance);
  for (std::string count; std::getline(in, count, ',');) counts.push_back(std::stoul(count));
  return counts;
}

parallel::pipeline::Balancer balance_by(const Config& c, const data::Dataset& train_set) {
  if (c.balance != "time") return nullptr;
  const int64_t micro_batch = std::min((c.batch_size + c.microbatches - 1) / c.microbatches, train_set.size());
  std::vector<int64_t> first(static_cast<size_t>(micro_batch));
  std::iota(first.begin(), first.end(), int64_t{0});
  return parallel::pipeline::by_time(train_set.get_batch(first).data);
}

// The model is on devices[0] already; each parallel mode adds its strategy here.
std::shared_ptr<train::Strategy> make_strategy(const Config& c, train::ParallelMode mode,
                                              const std::vector<Device>& devices, const data::Dataset& train_set) {
  WEFT_CHECK(mode == train::ParallelMode::Pipeline || (c.microbatches == 4 && c.schedule == "1f1b" &&
                                                       c.virtual_stages == 0 && c.balance.empty() &&
                                                       c.activation_checkpointing == "never" && c.replicas == 1),
             "--microbatches, --schedule, --virtual-stages, --balance, --activation-checkpointing and --replicas are "
             "for --mode pipeline");
  WEFT_CHECK(c.replicas == 1 || across_processes(mode), "--replicas is for --mode pipeline across processes (--nproc, "
             "or started by weft-run, torchrun, srun or mpirun): each replica is a pipeline of its own ranks");
  WEFT_CHECK(!c.sync_bn || mode == train::ParallelMode::DistributedDataParallel,
             "--sync-bn is for --mode ddp (it synchronises BatchNorm across processes, one device each)");
  WEFT_CHECK(!c.given.count("comm-hook") || mode == train::ParallelMode::DistributedDataParallel,
             "--comm-hook is for --mode ddp (it is how DistributedDataParallel's buckets cross between processes)");
  WEFT_CHECK(!c.zero || mode == train::ParallelMode::DistributedDataParallel,
             "--zero is for --mode ddp (it shards the optimizer's state over the processes of the job)");
  switch (mode) {
    case train::ParallelMode::Single: return std::make_shared<train::SingleDevice>();
    case train::ParallelMode::DataParallel: return std::make_shared<train::DataParallelStrategy>(devices);
    case train::ParallelMode::DistributedDataParallel: {
      train::DistributedStrategyOptions options;
      options.device = devices[0];
      options.sync_batch_norm = c.sync_bn;
      options.comm_hook = c.comm_hook;
      options.local_sgd_period = c.local_sgd;  // perhaps the resumed run's (run_flags)
      options.local_sgd_warmup = c.local_sgd_warmup;
      return std::make_shared<train::DistributedStrategy>(options);
    }
    case train::ParallelMode::Pipeline: {
      const int virtual_stages = c.virtual_stages > 0 ? c.virtual_stages : c.schedule == "interleaved" ? 2 : 1;
      std::shared_ptr<train::Strategy> strategy;
      if (across_processes(mode))
        strategy = std::make_shared<train::DistributedStrategy>(train::DistributedStrategyOptions{
            .device = devices[0],
            .plan = {.pp = parallel::ParallelPlan::kRest, .dp_replicate = c.replicas},
            .pipeline = {.micro_batches = c.microbatches, .schedule = c.schedule, .virtual_stages = virtual_stages,
                         .balance = balance_list(c), .balance_by = balance_by(c, train_set),
                         .activation_checkpointing = c.activation_checkpointing}});
      else
        strategy = std::make_shared<train::PipelineStrategy>(train::PipelineStrategyOptions{
            .devices = devices, .micro_batches = c.microbatches, .schedule = c.schedule,
            .virtual_stages = virtual_stages, .balance = balance_list(c), .balance_by = balance_by(c, train_set),
            .activation_checkpointing = c.activation_checkpointing});
      // Every rank alike, so none waits for another: the stages are the devices (or a
      // replica's ranks) times the stages on each.
      const int places = strategy->world_size() / c.replicas;
      const size_t stages = static_cast<size_t>(places * virtual_stages);
      const size_t given = balance_list(c).size();
      WEFT_CHECK(given == 0 || given == stages, "--balance ", c.balance, " gives ", given, " stages' layers; the ",
                 "pipeline has ", stages, " stages (", places, across_processes(mode) ? " ranks" : " devices",
                 c.replicas > 1 ? " of each replica" : "", " x ", virtual_stages, " per ",
                 across_processes(mode) ? "rank" : "device", ")");
      return strategy;
    }
  }
  WEFT_FAIL("weft-train: no strategy for mode ", train::parallel_mode_name(mode));
}

// The layers per stage of the pipeline the strategy made, as "1+3".
std::string stage_layers(const train::Strategy& strategy) {
  std::string text;
  for (size_t count : strategy.stage_layers()) text += (text.empty() ? "" : "+") + std::to_string(count);
  return text;
}

// A number as JSON has it: NaN and infinities, which JSON cannot write, as null; so is a
// value this run does not have (no training: no loss, no speed).
std::string json_number(std::optional<double> value) {
  if (!value || !std::isfinite(*value)) return "null";
  std::ostringstream out;
  out << *value;
  return out.str();
}

std::string device_list(const std::vector<Device>& devices) {
  std::string out;
  for (Device d : devices) out += (out.empty() ? "" : ",") + d.str();
  return out;
}

struct Metrics {
  std::optional<double> test_accuracy, final_loss, images_per_second;  // images: samples
  std::optional<double> val_loss, val_accuracy;                        // a GPT's
};

Metrics metrics_of(const std::vector<train::EpochResult>& results) {
  if (results.empty()) return {};
  double images = 0, seconds = 0;
  for (const auto& r : results) images += r.images_per_second * r.seconds, seconds += r.seconds;
  const train::EpochResult& last = results.back();
  return {last.test ? std::optional(last.test->accuracy) : std::nullopt, last.train_loss,
          seconds > 0 ? std::optional(images / seconds) : std::nullopt,
          last.val ? std::optional(last.val->loss) : std::nullopt,
          last.val ? std::optional(last.val->accuracy) : std::nullopt};
}

void write_metrics(const Config& c, const Metrics& m, train::TrainLoop& loop, train::ParallelMode mode,
                   const std::vector<Device>& devices, std::optional<double> unigram_loss) {
  std::ostringstream out;
  out << "{\n  \"model\": \"" << c.model << "\",\n  \"test_accuracy\": " << json_number(m.test_accuracy)
      << ",\n  \"final_loss\": " << json_number(m.final_loss) << ",\n  \"images_per_second\": "
      << json_number(m.images_per_second);
  if (c.is_gpt())
    out << ",\n  \"val_loss\": " << json_number(m.val_loss) << ",\n  \"val_accuracy\": "
        << json_number(m.val_accuracy) << ",\n  \"unigram_loss\": " << json_number(unigram_loss)
        << ",\n  \"tokens_per_second\": "
        << json_number(m.images_per_second ? std::optional(*m.images_per_second * static_cast<double>(c.block_size))
                                           : std::nullopt)
        << ",\n  \"parameters\": " << static_cast<const nn::GPT&>(loop.model()).num_parameters();
  out
      << ",\n  \"epochs\": " << loop.epoch() << ",\n  \"world_size\": " << loop.strategy().world_size()
      << ",\n  \"mode\": \"" << train::parallel_mode_name(mode) << "\",\n  \"device\": \"" << device_list(devices)
      << "\",\n  \"framework\": \"weft\",\n  \"threads\": " << num_threads() << "\n}\n";
  AtomicFile file(c.metrics_json, "--metrics-json");
  file.write(out.str());
  file.commit();
}

// --sample-tokens bytes generated from a newline, with --temperature and --top-k, seeded by
// --seed. On a copy of the model on `device`: a pipeline's stages are on several devices
// (every rank's copy holds every stage's trained values after the run, train/strategy.h).
void print_sample(const Config& c, const nn::Module& model, Device device) {
  std::shared_ptr<nn::Module> copy = model.clone(device);
  Generator gen(c.seed);
  nn::GenerateOptions options{.max_new_tokens = c.sample_tokens, .temperature = c.temperature, .gen = &gen};
  if (c.top_k > 0) options.top_k = c.top_k;
  const Tensor tokens = nn::generate(*copy, c.block_size, data::encode("\n").view({1, 1}), options);
  std::cout << "weft-train: a sample of " << c.sample_tokens << " bytes (temperature " << c.temperature
            << (c.top_k > 0 ? ", top-k " + std::to_string(c.top_k) : "") << "):\n"
            << data::decode(tokens.select(0, 0).narrow(0, 1, c.sample_tokens)) << "\n";
}

// " (1200 samples into epoch 3)" when the loop stands in the middle of an epoch, else "".
std::string mid_epoch(const train::TrainLoop& loop) {
  if (loop.epoch_samples() == 0) return "";
  return " (" + std::to_string(loop.epoch_samples()) + " samples into epoch " + std::to_string(loop.epoch() + 1) + ")";
}

// Relations between flags, checked before ranks are started.
void check_flags(const Config& c) {
  WEFT_CHECK(c.checkpoint_every == 0 || !c.checkpoint.empty(), "--checkpoint-every ", c.checkpoint_every,
             " needs --checkpoint: the file its mid-epoch checkpoints are written to");
  WEFT_CHECK(!c.given.count("local-sgd") || c.mode == "ddp",
             "--local-sgd is for --mode ddp (it averages the replicas of the processes of the job)");
  WEFT_CHECK(c.local_sgd > 0 || !c.given.count("local-sgd-warmup"), "--local-sgd-warmup ", c.local_sgd_warmup,
             " needs --local-sgd: the period of the averages that follow the warm-up");
  WEFT_CHECK(c.local_sgd == 0 || !c.zero, "--local-sgd and --zero do not go together: with --zero each rank steps "
             "its shard and broadcasts it, so the replicas never part and there is nothing to average");
  WEFT_CHECK(c.local_sgd == 0 || !c.given.count("comm-hook"), "--local-sgd brings its own communication hook (no "
             "gradient crosses after the warm-up); leave --comm-hook out");
  WEFT_CHECK(!c.given.count("nproc") || c.mode == "ddp" || c.mode == "pipeline", "--nproc is for --mode ddp or "
             "pipeline (the processes to start, one per device)");
  WEFT_CHECK(!c.given.count("replicas") || c.mode == "pipeline", "--replicas is for --mode pipeline (replicas of "
             "a pipeline across processes)");
  WEFT_CHECK(c.replicas == 1 || c.nproc == 0 || (c.nproc * c.nnodes) % c.replicas == 0, "--replicas ", c.replicas,
             " needs the job's ranks (--nproc x --nnodes) to be a multiple of it (replicas x ranks per pipeline), got ",
             c.nproc * c.nnodes);
  WEFT_CHECK(c.mode != "pipeline" || !c.given.count("nproc") || c.devices.empty(), "--mode pipeline takes --nproc "
             "(a stage per process) or --devices (a stage per device of one process), not both");
}

int run(Config c) {
  const bool main_process = !parallel::launched_as_rank() || parallel::read_launch_env().rank == 0;
  const bool elastic = train::elastic_from_env(std::getenv("WEFT_ELASTIC"));
  const train::ResumeChoice resume = train::choose_resume(elastic, c.checkpoint, c.resume);
  c.resume = resume.path;
  if (elastic && c.resume.empty() && main_process)
    std::cout << "weft-train: elastic run: no checkpoint at " << c.checkpoint << " yet, starting from the beginning"
              << std::endl;  // flushed: an elastic worker may well be killed before its buffer is
  if (!c.resume.empty()) continue_recorded_run(c, main_process);
  settle_model_defaults(c);
  // Started by weft-run's elastic agents: the workers end a round at a checkpoint when nodes
  // wait to join (train/elastic.h), and exit 0 so that the next round admits them. Said
  // before the data loads, so that a node arriving meanwhile waits for a checkpoint too.
  std::shared_ptr<train::ElasticAdmission> admission;
  if (const std::optional<train::ElasticEnv> env = train::read_elastic_env())
    admission = std::make_shared<train::ElasticAdmission>(*env, parallel::read_launch_env().rank);
  // Every output path is checked before the work (the loop checks --checkpoint and --trace).
  if (!c.metrics_json.empty() && main_process) check_writable(c.metrics_json, "--metrics-json");
  manual_seed(c.seed);
  const train::ParallelMode mode = train::parse_parallel_mode(c.mode);
  // Started as one rank of several (weft-run, torchrun, srun, mpirun): only ddp and the
  // pipeline train across processes; the other modes would train the same model side by side.
  if (parallel::launched_as_rank() && !across_processes(mode)) {
    const parallel::LaunchEnv launch = parallel::read_launch_env();
    WEFT_CHECK(launch.world_size == 1, "weft-train was started as ", launch.describe(), "; --mode ",
               train::parallel_mode_name(mode), " runs in one process (use --mode ddp or pipeline to train across "
               "processes)");
  }
  const std::vector<Device> devices = pick_devices(c, mode);

  std::shared_ptr<data::Dataset> train_set, test_set;
  std::optional<data::TextCorpus> corpus;
  if (c.is_gpt()) {
    // The validation split stands in for the test set: a GPT's val loss is what its runs report.
    corpus = data::TextCorpus::open(text_path(c));
    train_set = std::make_shared<data::TextDataset>(corpus->split(data::Split::Train, c.block_size));
    test_set = std::make_shared<data::TextDataset>(corpus->split(data::Split::Validation, c.block_size));
  } else if (c.data == "fashion-mnist") {
    train_set = std::make_shared<data::FashionMNIST>(c.data_dir, /*train=*/true);
    test_set = std::make_shared<data::FashionMNIST>(c.data_dir, /*train=*/false);
  } else {
    train_set = synthetic(10000, c.seed + 1);
    test_set = synthetic(2000, c.seed + 2);
  }
  data::DataLoaderOptions train_options;
  train_options.batch_size = c.batch_size;
  train_options.shuffle = true;
  train_options.num_workers = c.workers;
  train_options.seed = c.seed;
  data::DataLoaderOptions test_options = train_options;
  test_options.shuffle = false;
  test_options.batch_size = c.is_gpt() ? std::max<int64_t>(c.batch_size, 64) : 1000;
  auto train_loader = std::make_shared<data::DataLoader>(train_set, train_options);
  auto test_loader = std::make_shared<data::DataLoader>(test_set, test_options);

  std::shared_ptr<nn::Module> model = make_model(c);
  // A pipeline across processes moves only this rank's stages to its device (the rest of its
  // copy of the model stays in host memory); every other mode starts on devices[0].
  if (!(mode == train::ParallelMode::Pipeline && across_processes(mode))) model->to(devices[0]);
  train::TrainLoopOptions options;
  // ddp: joins the job's group, which --zero shards over.
  options.strategy = make_strategy(c, mode, devices, *train_set);
  auto optimizer = make_optimizer(c, param_groups(c, *model));
  // The steps of an epoch are this rank's share's (ddp and replicated pipelines shard the data).
  auto scheduler =
      make_scheduler(c, *optimizer, options.strategy->shard(train_loader, true)->size(), main_process);
  nn::CrossEntropyLoss cross_entropy;
  nn::Criterion criterion = [cross_entropy](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); };
  if (c.is_gpt()) {
    criterion = nn::next_token_loss;
    options.throughput_unit = {"tokens", "tok", c.block_size};
  }
  options.checkpoint_path = c.checkpoint;
  options.checkpoint_every = c.checkpoint_every;
  options.scheduler = scheduler;
  if (c.lr_schedule == "warmup-cosine") options.scheduler_interval = train::SchedulerInterval::Step;
  options.checkpoint_metadata = run_record(c);
  options.progress = !c.no_progress;
  options.trace_path = c.trace;
  train::TrainLoop loop(model, train_loader, c.is_gpt() ? test_loader : nullptr,
                        c.is_gpt() ? nullptr : test_loader, optimizer, criterion, options);
  if (!c.resume.empty()) {
    loop.resume(c.resume);
    if (main_process) {
      if (resume.automatic)
        std::cout << "weft-train: elastic run: resuming from " << c.resume << " after epoch " << loop.epoch()
                  << mid_epoch(loop) << std::endl;
      else
        std::cout << "resumed from " << c.resume << " after epoch " << loop.epoch() << mid_epoch(loop) << std::endl;
    }
    // With a schedule the rate is the schedule's at every epoch (or step): a new --lr would last
    // one of them. Repeating the run's own --lr (an elastic restart repeats its command line) is fine.
    if (scheduler && c.given.count("lr"))
      WEFT_CHECK(c.lr == scheduler->base_lr(), "--lr ", c.lr, " differs from the base learning rate ",
                 scheduler->base_lr(), " of the run being resumed, whose --lr-schedule ", c.lr_schedule, " sets the "
                 "rate at every ", c.lr_schedule == "warmup-cosine" ? "step" : "epoch", "; leave --lr out, or start "
                 "a new run without --resume");
    if (!scheduler && c.given.count("lr") && c.lr != optimizer->lr()) {
      if (main_process)
        std::cout << "weft-train: --lr " << c.lr << " replaces the checkpoint's learning rate " << optimizer->lr()
                  << "\n";
      optimizer->set_lr(c.lr);
    }
    c.lr = optimizer->lr();
  }
  const int ranks = loop.strategy().world_size();
  const std::string local_sgd = c.local_sgd == 0 ? ""
                                : ", local SGD (averaged every " + std::to_string(c.local_sgd) + " steps" +
                                      (c.local_sgd_warmup > 0 ? " after " + std::to_string(c.local_sgd_warmup) +
                                                                    " of plain DDP)"
                                                              : ")");
  const std::string pipeline = mode == train::ParallelMode::Pipeline
                                   ? " (" + c.schedule + ", " + std::to_string(c.microbatches) +
                                         " micro-batches, layers per stage " + stage_layers(loop.strategy()) +
                                         (c.balance == "time" ? " by their measured times" : "") +
                                         (c.activation_checkpointing == "never"
                                              ? ""
                                              : ", activation checkpointing " + c.activation_checkpointing) +
                                         (c.replicas > 1 ? ", " + std::to_string(c.replicas) + " replicas of " +
                                                               std::to_string(ranks / c.replicas) + " ranks"
                                                         : "") +
                                         ")"
                                   : "";
  const std::string where = across_processes(mode)
                                ? c.mode + " over " + std::to_string(ranks) + (ranks == 1 ? " rank (" : " ranks (") +
                                      device_list(devices) + " each)" + local_sgd + pipeline
                                : (devices.size() > 1 ? c.mode + " over " : "") + device_list(devices) + pipeline;
  if (main_process)
    std::cout << "weft-train: " << c.model << " on " << c.data << " (" << train_set->size() << " train, "
            << test_set->size() << " test), " << where << ", " << c.optimizer
            << (c.zero ? " (state sharded: --zero)" : "") << " lr " << c.lr
            << (scheduler ? " (" + c.lr_schedule + " schedule)" : "") << ", batch " << c.batch_size << ", "
            << num_threads() << " CPU threads\n";
  if (main_process && c.is_gpt())
    std::cout << "weft-train: GPT of " << c.n_layer << " blocks, " << c.n_head << " heads, width " << c.n_embd
              << ", " << c.block_size << " bytes per sequence, "
              << static_cast<const nn::GPT&>(*model).num_parameters() << " parameters, "
              << (c.ties_embeddings() ? "head tied to the token embedding"
                  : c.tie_embeddings ? "head untied"
                                     : "head untied (a pipeline's first and last stages cannot share a weight)")
              << "\n";
  if (admission) loop.add_callback(admission);
  Metrics metrics;
  if (c.epochs <= loop.epoch()) {
    // --epochs counts in total: a checkpoint that has them all has nothing left to train.
    // Its own weights are evaluated, so the run still reports what the checkpoint is worth.
    // A GPT's held-out split is the loop's validation set, the other models' its test set.
    const train::Evaluation test = (c.is_gpt() ? loop.evaluate_val() : loop.evaluate_test()).value();
    if (main_process)
      std::cout << "weft-train: nothing to train: '" << c.resume << "' has completed " << loop.epoch()
                << " epochs and --epochs " << c.epochs << " counts them in total (give --epochs "
                << loop.epoch() + 1 << " or more to train on); its "
                << (c.is_gpt() ? "validation loss is " + std::to_string(test.loss)
                               : "test accuracy is " + std::to_string(test.accuracy))
                << "\n";
    if (c.is_gpt()) metrics.val_loss = test.loss;
    else metrics.test_accuracy = test.accuracy;
  } else {
    metrics = metrics_of(loop.fit(c.epochs));
    if (admission && admission->admitting()) {
      if (main_process)
        std::cout << "weft-train: elastic run: stopping at this checkpoint; the next round admits the waiting nodes"
                  << std::endl;
      return 0;
    }
  }
  std::optional<double> unigram_loss;
  if (c.is_gpt()) {
    std::cout << std::defaultfloat << std::setprecision(4);  // the loop's lines leave fixed, 0 digits
    unigram_loss = corpus->unigram_entropy(data::Split::Train);
    if (main_process && metrics.val_loss)
      std::cout << "weft-train: validation loss " << *metrics.val_loss << " nats per byte (the unigram baseline, "
                << "bytes drawn by their frequency alone: " << *unigram_loss << ")\n";
    if (main_process && c.sample_tokens > 0) print_sample(c, *model, devices[0]);
  }
  if (!c.metrics_json.empty() && main_process) write_metrics(c, metrics, loop, mode, devices, unigram_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"weft-train: train a model on Fashion-MNIST, or a GPT on text, with weft"};
  app.add_option("--model", c.model, "convnet, mlp, resnet or gpt")
      ->check(CLI::IsMember({"convnet", "mlp", "resnet", "gpt"}));
  app.add_option("--data", c.data,
                 "fashion-mnist or synthetic; for --model gpt text (the fortunes corpus, " +
                     std::string(data::kDefaultTextCorpus) + ") or text:PATH (a text file, or a folder of them)")
      ->check([](const std::string& v) {
        return v == "fashion-mnist" || v == "synthetic" || v == "text" || (v.rfind("text:", 0) == 0 && v.size() > 5)
                   ? std::string()
                   : "expected fashion-mnist, synthetic, text or text:PATH, got '" + v + "'";
      });
  app.add_option("--n-layer", c.n_layer, "--model gpt: transformer blocks (4)")->check(flags::positive_integer());
  app.add_option("--n-head", c.n_head, "--model gpt: attention heads, dividing --n-embd (4)")
      ->check(flags::positive_integer());
  app.add_option("--n-embd", c.n_embd, "--model gpt: width (128)")->check(flags::positive_integer());
  app.add_option("--block-size", c.block_size, "--model gpt: tokens (bytes) per sequence (64)")
      ->check(flags::positive_integer());
  app.add_option("--dropout", c.dropout, "--model gpt: dropout on embeddings, attention and residual branches (0)")
      ->check(flags::number(0, std::nextafter(1.0, 0.0), false, "a number from 0 up to (not including) 1"));
  app.add_option("--tie-embeddings", c.tie_embeddings,
                 "--model gpt: true or false, the output projection is the token embedding (default: true, except "
                 "with --mode pipeline, whose first and last stages cannot share it)");
  app.add_option("--warmup-steps", c.warmup_steps, "--lr-schedule warmup-cosine: steps of linear warm-up (100)")
      ->check(flags::non_negative_integer());
  app.add_option("--lr-decay-steps", c.lr_decay_steps,
                 "--lr-schedule warmup-cosine: the step where the rate reaches lr/10 (default: the run's last)")
      ->check(flags::positive_integer());
  app.add_option("--sample-tokens", c.sample_tokens, "--model gpt: bytes to generate after training (200; 0: none)")
      ->check(flags::non_negative_integer());
  app.add_option("--temperature", c.temperature, "--model gpt: sampling temperature (0.8)")
      ->check(flags::positive_number());
  app.add_option("--top-k", c.top_k, "--model gpt: sample among the k most likely bytes (40; 0: all)")
      ->check(flags::non_negative_integer());
  app.add_option("--data-dir", c.data_dir, "where the Fashion-MNIST IDX files are");
  app.add_option("--device", c.device, "cpu, cpu:N, cuda or cuda:N (default: cuda when available, else cpu)")
      ->check(flags::non_empty("a device such as cpu or cuda:0"));
  app.add_option("--mode", c.mode, "single, dp, ddp or pipeline");
  app.add_option("--nproc", c.nproc,
                 "--mode ddp or pipeline started by hand: the ranks to start through weft-run (ddp's default: one "
                 "per GPU, else 2; pipeline: a stage per rank, without --nproc a stage per device of --devices)")
      ->check(flags::positive_integer());
  app.add_option("--nnodes", c.nnodes, "--mode ddp across machines: the number of nodes (run on each)")
      ->check(flags::positive_integer());
  app.add_option("--node-rank", c.node_rank, "--mode ddp across machines: this node's rank")
      ->check(flags::non_negative_integer());
  app.add_option("--master-addr", c.master_addr, "--mode ddp across machines: where rank 0 serves the rendezvous");
  app.add_option("--master-port", c.master_port, "--mode ddp: the rendezvous port (weft-run's default: 29500)")
      ->check(flags::integer(1, 65535, "a port from 1 to 65535"));
  app.add_option("--devices", c.devices,
                 "--mode dp or pipeline: the devices, e.g. cpu:0,cpu:1 or cuda:0,cuda:1 (default: every GPU, else "
                 "cpu:0,cpu:1); pipeline: one stage per device");
  app.add_flag("--sync-bn", c.sync_bn, "--mode ddp: BatchNorm statistics over every rank's samples (SyncBatchNorm)");
  app.add_option("--comm-hook", c.comm_hook,
                 "--mode ddp: how gradient buckets are averaged: allreduce (default), fp16 / bf16 (sent as 16-bit "
                 "floats: half the bytes), or powersgd (matrices sent as rank-1 factors after 10 exact iterations)")
      ->check(CLI::IsMember({"allreduce", "fp16", "bf16", "powersgd"}));
  app.add_flag("--zero", c.zero,
               "--mode ddp: each rank keeps and updates the optimizer state of its share of the parameters only, then "
               "broadcasts them (ZeroRedundancyOptimizer)");
  app.add_option("--local-sgd", c.local_sgd,
                 "--mode ddp: local SGD: after --local-sgd-warmup steps of plain DDP, each rank steps on its own "
                 "gradients and the replicas are averaged every N steps (and, with their optimizer state, at each "
                 "epoch's end and checkpoint)")
      ->check(flags::integer<int64_t>(1, std::numeric_limits<int64_t>::max(), "a positive integer"));
  app.add_option("--local-sgd-warmup", c.local_sgd_warmup, "--mode ddp --local-sgd: steps of plain DDP first (0)")
      ->check(flags::integer<int64_t>(0, std::numeric_limits<int64_t>::max(), "a non-negative integer"));
  app.add_option("--microbatches", c.microbatches, "--mode pipeline: micro-batches per batch (4)")
      ->check(flags::positive_integer());
  app.add_option("--schedule", c.schedule, "--mode pipeline: gpipe, 1f1b (default) or interleaved")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--balance", c.balance,
                 "--mode pipeline: layers per stage, e.g. 1,3; or time, to cut where the layers' measured forward "
                 "and backward times even out (default: as even a layer count as possible)")
      ->check(flags::counts_or("time"));
  app.add_option("--activation-checkpointing", c.activation_checkpointing,
                 "--mode pipeline: which micro-batches keep only their inputs and run their forward again in the "
                 "backward, for memory: never (default), except_last or always")
      ->check(CLI::IsMember({"never", "except_last", "always"}));
  app.add_option("--replicas", c.replicas,
                 "--mode pipeline across processes: R replicas of a pipeline of (ranks / R) ranks, each training on "
                 "its own share of the data (--batch-size per replica), their stages' gradients averaged over "
                 "the replicas during each step's last backward: pipeline x data parallelism (default 1)")
      ->check(flags::positive_integer());
  app.add_option("--virtual-stages", c.virtual_stages,
                 "--mode pipeline --schedule interleaved: stages per device (default 2 with interleaved)")
      ->check(flags::positive_integer());
  app.add_option("--epochs", c.epochs, "epochs to train (in total, when resuming)")->check(flags::positive_integer());
  app.add_option("--batch-size", c.batch_size,
                 "samples per batch (per rank in ddp, as PyTorch's per-process loader; per replica with --replicas)")
      ->check(flags::integer<int64_t>(1, std::numeric_limits<int64_t>::max(), "a positive integer"));
  app.add_option("--optimizer", c.optimizer, "sgd, adam or adamw (default: sgd; adamw for --model gpt)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", c.lr,
                 "learning rate (default 0.01; 1e-3 for --model gpt; resuming: replaces the checkpoint's)")
      ->check(flags::positive_number());
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(flags::number(0, 1, false, "a number from 0 to 1"));
  app.add_option("--weight-decay", c.weight_decay,
                 "weight decay (default: 0 for sgd and adam, 1e-2 for adamw; --model gpt: 0.1, on matrices and "
                 "embeddings only)")
      ->check(flags::non_negative_number());
  app.add_option("--seed", c.seed, "seed of the weights, the shuffling and dropout")->check(flags::unsigned_64());
  app.add_option("--workers", c.workers, "data-loader worker threads (at most " + std::to_string(kMaxWorkers) + ")")
      ->check(flags::integer(0, kMaxWorkers, "an integer from 0 to " + std::to_string(kMaxWorkers)));
  app.add_option("--lr-schedule", c.lr_schedule,
                 "constant (default), cosine (to 0 over --epochs), step (halved after every epoch) or warmup-cosine "
                 "(--warmup-steps of warm-up, then cosine to lr/10 at the last step; --model gpt's default); "
                 "resuming: the checkpoint's")
      ->check(CLI::IsMember({"constant", "cosine", "step", "warmup-cosine"}));
  app.add_option("--checkpoint", c.checkpoint,
                 "save a checkpoint here after every epoch; with WEFT_ELASTIC=1, also resume from it when it exists");
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "also save the checkpoint every K steps inside an epoch (a resumed run goes on from that step)")
      ->check(flags::integer<int64_t>(1, std::numeric_limits<int64_t>::max(), "a positive integer"));
  app.add_option("--resume", c.resume, "resume from this checkpoint");
  app.add_option("--metrics-json", c.metrics_json, "write the final metrics here");
  app.add_option("--trace", c.trace,
                 "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of the run here: a row per device, "
                 "spans for each step's phases");
  app.add_flag("--no-progress", c.no_progress, "no per-step progress, only a line per epoch");
  CLI11_PARSE(app, argc, argv);
  for (const CLI::Option* option : app.get_options())
    if (option->count() > 0) c.given.insert(option->get_single_name());
  try {
    // A resumed run must give the bits of an uninterrupted one (core/determinism.h);
    // WEFT_DETERMINISTIC=0 trades that for cuDNN's timed algorithm choice.
    use_deterministic_algorithms(deterministic_setting(std::getenv("WEFT_DETERMINISTIC"), true));
    check_flags(c);
    // --mode ddp (or pipeline with --nproc) started by hand: this program again, as the ranks
    // of a job under weft-run.
    if ((c.mode == "ddp" || (c.mode == "pipeline" && c.nproc > 0)) && !parallel::launched_as_rank()) {
      const int ranks = c.nproc > 0 ? c.nproc : cuda_physical_device_count() > 0 ? cuda_physical_device_count() : 2;
      std::cout << "weft-train: --mode " << c.mode << ": starting " << ranks << (ranks == 1 ? " rank" : " ranks")
                << (c.nnodes > 1 ? " on this node" : "") << " with weft-run" << std::endl;
      train::run_as_ranks(ranks, argc, argv, {c.nnodes, c.node_rank, c.master_addr, c.master_port});
    }
    const int status = run(c);
    if (parallel::is_initialized()) parallel::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::cerr << "weft-train: " << e.what() << "\n";
    return 1;
  }
}
