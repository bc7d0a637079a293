// TrainLoop: fit / evaluate / checkpoint / resume for a model (the loop a PyTorch training script
// writes by hand, as one object).
//
//   TrainLoop loop(model, train_loader, val_loader, test_loader, optimizer, criterion);
//   loop.fit(3);
//
// The model trains on the device it is on. options.strategy says otherwise (train/strategy.h:
// the loop calls the strategy at fixed points and never branches on the parallel mode).
// An epoch sets the loaders' epoch (so shuffling is a function of (seed, epoch)), trains
// over the train loader, then evaluates val and test. A checkpoint holds the model, the
// optimizer, the scheduler, the strategy's state (local SGD's step count), the epoch and every
// default generator's state, so a resumed run ends with the same weights as an uninterrupted
// one. Before evaluating and before a mid-epoch checkpoint the strategy consolidates replicas
// that may have drifted apart (ddp with local SGD: Note [Local SGD in the TrainLoop]).
//
// Note [Mid-epoch checkpoints]: with options.checkpoint_every = K a checkpoint is also
// written after every K-th step of an epoch (not after its last: the epoch's own covers
// that). It records where the unfinished epoch stands: "epoch" (epochs completed),
// "epoch_samples" (samples of the next epoch trained, summed over every rank: over the
// replicas of a pipeline), "epoch_loss_sum" and "epoch_batches" (that epoch's partial loss
// total and batch count, likewise, so that a resumed epoch still reports the mean over all
// its batches); 0 at an epoch's end. fit() after resume() starts that epoch with the train loader's
// set_start(epoch_samples): the samplers skip exactly what was trained, and DistributedSampler
// shards the rest over the current world size (data/sampler.h). In one process the resumed
// steps are bitwise those of an uninterrupted run: the weights, the optimizer and the
// generators come back, the loader numbers batches from the epoch's start (its per-batch
// seeds match, data/dataloader.h) and the main process's loss sum starts from the recorded
// partial one, so even the epoch's mean is added up in the same order. The partial totals
// are combined with the strategy's reduce(), a collective in ddp: every rank reaches the
// step at the same time, as every rank has the same number of batches. "epoch_order" names
// the train sampler's global order (Sampler::global_order): positions count samples of that
// order, so resume() says so when this loop's order is another (a ddp checkpoint resumed on
// one device: DistributedSampler's permutation against RandomSampler's), since the rest of
// that epoch is then not what the checkpoint's run had left.
#pragma once

#include <functional>
#include <atomic>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/dataloader.h"
#include "nn/module.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/optimizer.h"
#include "train/strategy.h"

namespace weft::train {

struct Evaluation {
  double loss = 0;      // mean over samples
  // The fraction of targets that the output's argmax along its last dim predicts: one per
  // sample for a classifier ([N, C] outputs), one per position for a language model ([B, T, V]
  // outputs against [B, T] targets: next-token accuracy).
  double accuracy = 0;
  int64_t samples = 0;
};

struct EpochResult {
  int epoch = 0;              // 1-based
  double train_loss = 0;      // mean of the batch losses
  double seconds = 0;         // training only, evaluation excluded
  double images_per_second = 0;  // samples per second (TrainLoopOptions::throughput_unit says what else)
  std::optional<Evaluation> val, test;
};

class TrainLoop;

// Hooks into the loop; override what you need. `step` counts batches from 0 in an epoch (a
// resumed epoch counts on from its checkpoint's step).
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_epoch_begin(TrainLoop& loop, int epoch) {}
  virtual void on_epoch_end(TrainLoop& loop, const EpochResult& result) {}
  virtual void on_batch_begin(TrainLoop& loop, int64_t step) {}
  virtual void on_after_optimizer_step(TrainLoop& loop, int64_t step) {}
  virtual void on_batch_end(TrainLoop& loop, int64_t step, double loss) {}
  // After each checkpoint (mid-epoch and at an epoch's end, before on_epoch_end), on every
  // rank, not only the main process that writes it: the file is complete and in place when
  // this is called (the ranks meet at a barrier first). loop.epoch() and
  // loop.epoch_samples() say which point of training it holds. The place to call
  // loop.request_stop() to end fit() at this boundary.
  virtual void on_checkpoint(TrainLoop& loop) {}
};

// What the loop's speeds count: images by default (a sample each); a language model's samples
// hold block_size tokens each ({"tokens", "tok", block_size}).
struct ThroughputUnit {
  std::string name = "images";
  std::string abbreviation = "img";
  int64_t per_sample = 1;
};

// When TrainLoopOptions::scheduler steps.
enum class SchedulerInterval {
  Epoch,  // after each epoch's training (StepLR, CosineAnnealingLR over epochs)
  Step,   // after each optimizer step (warm-up then cosine over steps, as nanoGPT's)
};

struct TrainLoopOptions {
  std::shared_ptr<Strategy> strategy;  // null: SingleDevice, on the model's device
  std::string checkpoint_path;  // written after every epoch when not empty (by the main process)
  // With a checkpoint_path: also a checkpoint after every `checkpoint_every`-th step of an
  // epoch (Note [Mid-epoch checkpoints]); 0: only at epochs' ends.
  int64_t checkpoint_every = 0;
  // Stepped once after each epoch's training, or after each step (scheduler_interval); must
  // act on the loop's optimizer. Its state is saved in checkpoints ("scheduler" = its name(),
  // "scheduler.<key>") and restored by resume(), so a resumed run's schedule goes on where it was.
  std::shared_ptr<optim::LRScheduler> scheduler;
  SchedulerInterval scheduler_interval = SchedulerInterval::Epoch;
  ThroughputUnit throughput_unit;
  // Written into every checkpoint's metadata beside the loop's own entries (a program's
  // run configuration: weft-train records its flags and checks them on resume). Keys must
  // not be the loop's: "format", "epoch", "epoch_samples", "epoch_loss_sum",
  // "epoch_batches", "epoch_order", "scheduler", "rng.*", "optimizer.*", "scheduler.*", "strategy.*".
  std::map<std::string, std::string> checkpoint_metadata;
  bool progress = true;         // per-step progress: a bar on a terminal, plain lines otherwise
  std::ostream* log = nullptr;  // where progress and epoch lines go (default std::cout)
  // fit() records a Chrome trace of its steps (core/trace.h: one row per device, spans for
  // each step's forward, backward and optimizer step, DataParallel's scatter, replicate,
  // per-replica forward and gather, DDP's bucket all-reduces, evaluation, checkpoints) and
  // writes it here at the end (rank r > 0 of a ddp run: NAME.rank<r>.json beside it).
  std::string trace_path;
};

class TrainLoop {
 public:
  TrainLoop(std::shared_ptr<nn::Module> model, std::shared_ptr<data::DataLoader> train_loader,
            std::shared_ptr<data::DataLoader> val_loader, std::shared_ptr<data::DataLoader> test_loader,
            std::shared_ptr<optim::Optimizer> optimizer, Criterion criterion, TrainLoopOptions options = {});

  // Trains until `epochs` epochs are complete in total: after resume() from epoch 1,
  // fit(3) trains epochs 2 and 3 (from where a mid-epoch checkpoint left epoch 2). Returns
  // the epochs it completed. A NaN or infinite loss stops it with "training diverged"
  // (seen when a step's loss is read for the progress display or a callback, else in the
  // epoch's sum at its end or at a mid-epoch checkpoint: no extra read-back per step),
  // before that checkpoint is written. A stop requested with request_stop() ends it at the
  // next checkpoint point.
  std::vector<EpochResult> fit(int epochs);
  // Called by hand (not by fit) in ddp with local SGD, where each rank's replica may differ
  // from the others': every rank calls strategy().consolidate_replicas(optimizer()) first to
  // evaluate or save one model.
  Evaluation evaluate(data::DataLoader& loader);
  // The test loader given at construction (as the strategy shards it), as fit() evaluates it
  // after an epoch; nullopt without one.
  std::optional<Evaluation> evaluate_test();
  // The same for the validation loader.
  std::optional<Evaluation> evaluate_val();
  void add_callback(std::shared_ptr<Callback> callback) { callbacks_.push_back(std::move(callback)); }

  // Refuses (throws, leaving `path` as it was) when a weight is NaN or infinite. Records the
  // position of the last checkpoint point: called by hand in the middle of an epoch it would
  // pair the current weights with an older position (use options.checkpoint_every). With a
  // sharded optimizer (parallel::ZeroRedundancyOptimizer), every rank must have called
  // optimizer().consolidate_state_dict() first, as the loop's own checkpoints do; with local
  // SGD, strategy().consolidate_replicas(optimizer()) too (see evaluate).
  void save_checkpoint(const std::string& path) const;
  // Loads a checkpoint (this loop's scheduler, if any, must match the one saved; its metadata
  // is checked before anything changes). The next fit() goes on from its point.
  void resume(const std::string& path);

  // Ends fit() at the next checkpoint point: after the mid-epoch checkpoint or the epoch's
  // end that comes next (right away when called from Callback::on_checkpoint; without a
  // checkpoint_path, at the epoch's end), with that checkpoint written; fit() returns the
  // epochs completed, and the next fit() goes on from that point. In ddp every rank must request
  // it at the same point (deciding that together is the caller's job: a rank that stops
  // alone leaves the others waiting in their next collective). Safe from another thread;
  // fit() clears it when it starts.
  void request_stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }

  int epoch() const { return epoch_; }  // epochs completed
  // Samples of epoch epoch() + 1 already trained (over every rank): where the next fit()
  // resumes it; 0 but after a mid-epoch checkpoint or a resume() from one.
  int64_t epoch_samples() const { return epoch_samples_; }
  nn::Module& model() { return *model_; }  // as given (unwrapped): what checkpoints hold
  Strategy& strategy() { return *strategy_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const TrainLoopOptions& options() const { return options_; }

 private:
  // nullopt: stopped at a mid-epoch checkpoint (request_stop).
  std::optional<EpochResult> train_epoch(int epoch, int epochs);
  // Saves (main process), waits for every rank, then calls on_checkpoint.
  void checkpoint_point();
  // Throws "training diverged: ..." when `loss` is NaN or infinite (`where`: which loss).
  void check_finite_loss(double loss, int epoch, const std::string& where) const;
  // Throws unless every rank starts fit() at the same epoch and sample (one collective).
  void check_same_start();

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<Strategy> strategy_;
  std::shared_ptr<nn::Module> runner_;  // what the strategy made of model_: forward goes through it
  std::shared_ptr<data::DataLoader> train_loader_, val_loader_, test_loader_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  Criterion criterion_;
  TrainLoopOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  int epoch_ = 0;
  // The unfinished epoch epoch_ + 1: Note [Mid-epoch checkpoints].
  int64_t epoch_samples_ = 0;
  double epoch_loss_sum_ = 0;
  int64_t epoch_batches_ = 0;
  std::atomic<bool> stop_requested_{false};
  double last_step_lr_ = 0;  // the learning rate of the last step trained (per-step schedules move it)
};

}  // namespace weft::train
