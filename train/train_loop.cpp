// TrainLoop: the epoch loop, evaluation and checkpoints.
#include "train/train_loop.h"

#include <cmath>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>

#include "core/atomic_file.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/trace.h"
#include "data/device_prefetcher.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "train/checkpoint.h"
#include "train/progress.h"

namespace weft::train {

TrainLoop::TrainLoop(std::shared_ptr<nn::Module> model, std::shared_ptr<data::DataLoader> train_loader,
                     std::shared_ptr<data::DataLoader> val_loader, std::shared_ptr<data::DataLoader> test_loader,
                     std::shared_ptr<optim::Optimizer> optimizer, Criterion criterion, TrainLoopOptions options)
    : model_(std::move(model)), strategy_(options.strategy), train_loader_(std::move(train_loader)),
      val_loader_(std::move(val_loader)), test_loader_(std::move(test_loader)), optimizer_(std::move(optimizer)),
      criterion_(std::move(criterion)), options_(std::move(options)) {
  WEFT_CHECK(model_ && train_loader_ && optimizer_ && criterion_, "TrainLoop: the model, the train loader, the "
             "optimizer and the criterion are required");
  for (const auto& [key, value] : options_.checkpoint_metadata)
    WEFT_CHECK(!is_checkpoint_metadata(key), "TrainLoop: checkpoint_metadata key '", key,
               "' is reserved for the loop's own entries");
  WEFT_CHECK(options_.checkpoint_every >= 0, "TrainLoop: checkpoint_every must be non-negative (0: only at epochs' "
             "ends), got ", options_.checkpoint_every);
  WEFT_CHECK(options_.checkpoint_every == 0 || !options_.checkpoint_path.empty(), "TrainLoop: checkpoint_every = ",
             options_.checkpoint_every, " needs a checkpoint_path to write the checkpoints to");
  WEFT_CHECK(!options_.scheduler || &options_.scheduler->optimizer() == optimizer_.get(), "TrainLoop: the ",
             options_.scheduler ? options_.scheduler->name() : "", " scheduler acts on another optimizer than the "
             "loop's");
  if (!strategy_) strategy_ = std::make_shared<SingleDevice>();
  runner_ = strategy_->prepare(model_);
  train_loader_ = strategy_->shard(train_loader_, /*training=*/true);
  if (val_loader_) val_loader_ = strategy_->shard(val_loader_, false);
  if (test_loader_) test_loader_ = strategy_->shard(test_loader_, false);
}

namespace {

// Rank 0 writes the trace where asked; rank r > 0 beside it: run.trace.json -> run.trace.rank1.json.
std::string trace_path_for_rank(const std::string& path, int rank) {
  if (rank == 0 || path.empty()) return path;
  const std::string suffix = ".json";
  const std::string tag = ".rank" + std::to_string(rank);
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return path.substr(0, path.size() - suffix.size()) + tag + suffix;
  return path + tag;
}

// Only the main process speaks; the others write into a stream that discards.
std::ostream& log_stream(const TrainLoopOptions& o, const Strategy& strategy) {
  static std::ostream discard(nullptr);
  if (!strategy.is_main_process()) return discard;
  return o.log ? *o.log : std::cout;
}

}  // namespace

void TrainLoop::check_finite_loss(double loss, int epoch, const std::string& where) const {
  if (std::isfinite(loss)) return;
  const std::string path = " ('" + options_.checkpoint_path + "') is kept";
  const std::string kept = options_.checkpoint_path.empty() ? ""
                           : epoch_samples_ > 0 ? "; the checkpoint from " + std::to_string(epoch_samples_) +
                                                      " samples into epoch " + std::to_string(epoch_ + 1) + path
                           : epoch > 1          ? "; the checkpoint of epoch " + std::to_string(epoch - 1) + path
                                                : "; no checkpoint was written";
  WEFT_FAIL("training diverged: the loss is ", std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf", " in epoch ",
            epoch, " (", where, "), so the weights are no longer usable", kept,
            ". Lower the learning rate or clip the gradients, then resume from the last checkpoint.");
}

void TrainLoop::checkpoint_point() {
  if (options_.checkpoint_path.empty()) return;
  // A sharded optimizer (parallel::ZeroRedundancyOptimizer) gathers its state on the main
  // process, rank 0, which alone writes; every other optimizer has nothing to do here.
  optimizer_->consolidate_state_dict(0);
  if (strategy_->is_main_process()) save_checkpoint(options_.checkpoint_path);
  strategy_->barrier();
  for (auto& cb : callbacks_) cb->on_checkpoint(*this);
}

std::optional<EpochResult> TrainLoop::train_epoch(int epoch, int epochs) {
  std::ostream& log = log_stream(options_, *strategy_);
  runner_->train();
  train_loader_->set_epoch(epoch - 1);
  // A resumed epoch skips what its checkpoint's run trained (Note [Mid-epoch checkpoints]);
  // `first` is the epoch's number of this pass's first batch, so steps count from the epoch's
  // start. The recorded totals are the base that this pass adds to.
  train_loader_->set_start(epoch_samples_);
  const int64_t first = train_loader_->first_batch();
  const int64_t steps = first + train_loader_->size();
  const int64_t base_samples = epoch_samples_, base_batches = epoch_batches_;
  const int64_t every = options_.checkpoint_every;
  const Device device = strategy_->input_device();
  const ThroughputUnit& unit = options_.throughput_unit;
  Progress progress(log, strategy_->is_main_process() && Progress::is_terminal(log), epoch, epochs, steps, first,
                    unit.abbreviation);
  // The epoch's loss is summed on the device; a batch's loss is read back (a host
  // synchronisation on a GPU, which would stall the queue of launches) only when a
  // callback or the progress display needs it. The main process's sum starts from the
  // recorded partial one (the others' from 0): the additions of an uninterrupted run, in its order.
  Tensor loss_sum =
      full({}, strategy_->is_main_process() ? epoch_loss_sum_ : 0.0, TensorOptions(DType::Float64, device));
  int64_t step = first, images = 0;
  bool stopped = false;
  auto start = std::chrono::steady_clock::now();
  // Batches reach the device one ahead: on a GPU the next upload overlaps this step.
  for (const data::Batch& batch : data::DevicePrefetcher(*train_loader_, device)) {
    TraceSpan span("train step", device);
    span.arg("step", step);
    for (auto& cb : callbacks_) cb->on_batch_begin(*this, step);
    Tensor loss = strategy_->train_step(batch, criterion_, *optimizer_);
    last_step_lr_ = optimizer_->lr();
    if (options_.scheduler && options_.scheduler_interval == SchedulerInterval::Step) options_.scheduler->step();
    for (auto& cb : callbacks_) cb->on_after_optimizer_step(*this, step);
    {
      NoGradGuard no_grad;
      loss_sum = add(loss_sum, loss.detach().to(DType::Float64));
    }
    images += batch.data.size(0);
    ++step;
    const bool show = options_.progress && progress.due(step);
    if (show || !callbacks_.empty()) {
      double value = loss.item();
      for (auto& cb : callbacks_) cb->on_batch_end(*this, step - 1, value);
      if (show) progress.update(step, value, images * unit.per_sample);
      check_finite_loss(value, epoch, "step " + std::to_string(step) + " of " + std::to_string(steps));
    }
    // Every rank has as many batches, so every rank takes this branch at the same step and
    // meets the others in reduce().
    if (every > 0 && step % every == 0 && step < steps) {
      Totals so_far = strategy_->reduce({.loss = loss_sum.item(), .samples = static_cast<double>(images),
                                         .batches = static_cast<double>(step - first)});
      check_finite_loss(so_far.loss, epoch, "the sum of its first " + std::to_string(step) + " steps");
      epoch_samples_ = base_samples + static_cast<int64_t>(so_far.samples);
      epoch_loss_sum_ = so_far.loss;  // the main process's sum started from the recorded one
      epoch_batches_ = base_batches + static_cast<int64_t>(so_far.batches);
      strategy_->consolidate_replicas(*optimizer_);
      checkpoint_point();
      if (stop_requested_) {
        stopped = true;
        break;
      }
    }
  }
  train_loader_->set_start(0);  // later passes (and epochs) are whole
  progress.finish();
  if (stopped) return std::nullopt;
  // Reading the sum waits for the device: the epoch's time is honest.
  Totals totals = strategy_->reduce({.loss = loss_sum.item(),
                                     .samples = static_cast<double>(images),
                                     .batches = static_cast<double>(step - first)});
  // A non-finite step anywhere makes the sum non-finite: divergence is caught here at the
  // latest, with no read-back per step, and before the epoch's checkpoint is written.
  check_finite_loss(totals.loss, epoch, "the epoch's mean");
  const double batches = static_cast<double>(base_batches) + totals.batches;
  EpochResult result;
  result.epoch = epoch;
  result.train_loss = batches > 0 ? totals.loss / batches : 0;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The speed of this pass: samples trained before a resume took another run's time.
  result.images_per_second = result.seconds > 0 ? totals.samples / result.seconds : 0;
  return result;
}

std::vector<EpochResult> TrainLoop::fit(int epochs) {
  std::ostream& log = log_stream(options_, *strategy_);
  const bool tracing = !options_.trace_path.empty();
  const std::string trace_path = trace_path_for_rank(options_.trace_path, strategy_->rank());
  // Output paths are checked before the work, not after it.
  if (tracing) check_writable(trace_path, "trace::write");
  if (!options_.checkpoint_path.empty() && strategy_->is_main_process())
    check_writable(options_.checkpoint_path, "save_checkpoint");
  check_same_start();
  if (tracing) trace::start();
  struct StopTracing {  // a fit() that throws still ends its recording
    bool on;
    ~StopTracing() {
      if (on) trace::stop();
    }
  } stop_tracing{tracing};
  stop_requested_ = false;
  std::vector<EpochResult> results;
  while (epoch_ < epochs) {
    int epoch = epoch_ + 1;
    for (auto& cb : callbacks_) cb->on_epoch_begin(*this, epoch);
    std::optional<EpochResult> trained = train_epoch(epoch, epochs);
    if (!trained) break;  // stopped at a mid-epoch checkpoint
    EpochResult result = *trained;
    strategy_->consolidate_replicas(*optimizer_);  // one model to evaluate and save
    // The epoch's rate before a per-epoch schedule moves it; a per-step schedule's last step's.
    const double lr = options_.scheduler_interval == SchedulerInterval::Step ? last_step_lr_ : optimizer_->lr();
    if (options_.scheduler && options_.scheduler_interval == SchedulerInterval::Epoch) options_.scheduler->step();
    if (val_loader_) result.val = evaluate(*val_loader_);
    if (test_loader_) result.test = evaluate(*test_loader_);
    epoch_ = epoch;
    epoch_samples_ = 0, epoch_loss_sum_ = 0, epoch_batches_ = 0;
    log << "epoch " << epoch << "/" << epochs << ": train loss " << std::fixed << std::setprecision(4)
        << result.train_loss;
    if (result.val) log << ", val loss " << result.val->loss << ", val accuracy " << result.val->accuracy;
    if (result.test) log << ", test accuracy " << result.test->accuracy;
    if (options_.scheduler) log << ", lr " << std::defaultfloat << std::setprecision(6) << lr << std::fixed;
    const ThroughputUnit& unit = options_.throughput_unit;
    log << ", " << std::setprecision(0) << result.images_per_second * static_cast<double>(unit.per_sample) << " "
        << unit.name << "/s" << std::endl;
    checkpoint_point();
    for (auto& cb : callbacks_) cb->on_epoch_end(*this, result);
    results.push_back(result);
    if (stop_requested_) break;
  }
  if (tracing) trace::write(trace_path);
  return results;
}

// Ranks that start at different points (one resumed from a checkpoint another did not see)
// would run different numbers of steps and wait for each other in a collective forever. The
// point travels in count fields, which every strategy combines on every rank alike (the
// pipeline across processes takes the loss from the main process alone).
void TrainLoop::check_same_start() {
  const double epoch = epoch_, samples = static_cast<double>(epoch_samples_);
  const Totals all = strategy_->reduce({.correct = epoch, .samples = samples, .batches = 1});
  WEFT_CHECK(all.correct == all.batches * epoch && all.samples == all.batches * samples, "TrainLoop::fit: rank ",
             strategy_->rank(), " starts after epoch ", epoch_, " + ", epoch_samples_, " samples, but the job's ranks "
             "start on average after epoch ", all.correct / all.batches, " + ",
             all.samples / all.batches, " samples: every rank must resume from the same checkpoint (is the file on "
             "storage that every rank sees?)");
}

Evaluation TrainLoop::evaluate(data::DataLoader& loader) {
  NoGradGuard no_grad;
  bool was_training = runner_->is_training();
  runner_->eval();
  const Device device = strategy_->input_device();
  TraceSpan span("evaluate", device);
  // Summed on the device and read once at the end: no host synchronisation per batch.
  Tensor loss_sum = zeros({}, TensorOptions(DType::Float64, device));
  // Per sample: the fraction of its targets predicted (1 or 0 for a classifier).
  Tensor correct = zeros({}, TensorOptions(DType::Float64, device));
  int64_t samples = 0;
  for (const data::Batch& batch : data::DevicePrefetcher(loader, device)) {
    Tensor out = strategy_->forward(batch.data);
    const int64_t n = batch.data.size(0);
    loss_sum = add(loss_sum, mul(criterion_(out, batch.target).to(DType::Float64), static_cast<double>(n)));
    const double targets_per_sample = static_cast<double>(batch.target.numel()) / static_cast<double>(n);
    correct = add(correct, div(sum(eq(argmax(out, -1), batch.target).to(DType::Int64)).to(DType::Float64),
                               targets_per_sample));
    samples += n;
  }
  runner_->train(was_training);
  Totals totals = strategy_->reduce({.loss = samples > 0 ? loss_sum.item() : 0.0,
                                     .correct = samples > 0 ? correct.item() : 0.0,
                                     .samples = static_cast<double>(samples)});
  Evaluation e;
  e.samples = static_cast<int64_t>(totals.samples);
  if (totals.samples > 0) {
    e.loss = totals.loss / totals.samples;
    e.accuracy = totals.correct / totals.samples;
  }
  return e;
}

std::optional<Evaluation> TrainLoop::evaluate_test() {
  if (!test_loader_) return std::nullopt;
  return evaluate(*test_loader_);
}

std::optional<Evaluation> TrainLoop::evaluate_val() {
  if (!val_loader_) return std::nullopt;
  return evaluate(*val_loader_);
}

// --- checkpoints (train/checkpoint.h) ------------------------------------------------

void TrainLoop::save_checkpoint(const std::string& path) const {
  TraceSpan span("checkpoint", strategy_->input_device());
  Checkpoint c;
  for (auto& [name, t] : model_->state_dict()) {
    // Non-finite weights never replace a checkpoint (a diverged run would destroy the last
    // good one).
    WEFT_CHECK(!is_floating(t.dtype()) || t.numel() == 0 || std::isfinite(amax(abs(t)).item()),
               "save_checkpoint: the model's '", name, "' holds NaN or infinite values; '", path,
               "' is left as it was");
    c.model.emplace_back(name, t);
  }
  c.optimizer = optimizer_->state_dict();
  c.epoch = epoch_;
  c.epoch_samples = epoch_samples_, c.epoch_loss_sum = epoch_loss_sum_, c.epoch_batches = epoch_batches_;
  c.epoch_order = train_loader_->sampler().global_order();
  for (auto& [device, gen] : default_generators()) c.generators.push_back({device, gen->seed(), gen->offset()});
  if (options_.scheduler) {
    c.scheduler = options_.scheduler->name();
    c.scheduler_state = options_.scheduler->state_dict();
  }
  c.strategy_state = strategy_->state_dict();
  c.metadata = options_.checkpoint_metadata;
  write_checkpoint(path, c);
}

void TrainLoop::resume(const std::string& path) {
  // Everything is read and checked before anything is changed.
  const Checkpoint c = read_checkpoint(path);
  check_resumable(c, path, options_.scheduler.get(), *strategy_);
  restore_checkpoint(c, *model_, *optimizer_, *strategy_, options_.scheduler.get());
  epoch_ = c.epoch;
  epoch_samples_ = c.epoch_samples, epoch_loss_sum_ = c.epoch_loss_sum, epoch_batches_ = c.epoch_batches;
  // A mid-epoch checkpoint's position counts samples of its run's order (Note [Mid-epoch
  // checkpoints]); in another order the rest of that epoch is not what that run had left.
  const std::string mine = train_loader_->sampler().global_order();
  const int64_t next_epoch = int64_t{c.epoch} + 1;
  if (c.epoch_samples > 0 && !c.epoch_order.empty() && !mine.empty() && c.epoch_order != mine)
    log_stream(options_, *strategy_)
        << "weft: resume: '" << path << "' stopped " << c.epoch_samples << " samples into epoch " << next_epoch
        << ", which its run took in " << c.epoch_order << "; this loop takes it in " << mine << ", so the rest of "
        << "epoch " << next_epoch << " is not the samples that run had left (some are trained twice, others not at "
        << "all). Later epochs are whole. (ddp and replicated pipelines take DistributedSampler's order; one device, "
        << "dp and one pipeline the loader's own.)" << std::endl;
}

}  // namespace weft::train
