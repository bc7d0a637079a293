// TrainLoop: fit / evaluate / checkpoint / resume for a model, after seed 000's TrainLoop.
//
//   TrainLoop loop(model, train_loader, val_loader, test_loader, optimizer, criterion);
//   loop.fit(3);
//
// The model trains on the device it is on. options.strategy says otherwise (train/strategy.h:
// the loop calls the strategy at fixed points and never branches on the parallel mode).
// An epoch sets the loaders' epoch (so shuffling is a function of (seed, epoch)), trains
// over the train loader, then evaluates val and test. A checkpoint holds the model, the
// optimizer, the epoch and every default generator's state, so a resumed run ends with
// the same weights as an uninterrupted one.
#pragma once

#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/dataloader.h"
#include "nn/module.h"
#include "nn/optim/optimizer.h"
#include "train/strategy.h"

namespace weft::train {

struct Evaluation {
  double loss = 0;      // mean over samples
  double accuracy = 0;  // argmax of the output equals the target
  int64_t samples = 0;
};

struct EpochResult {
  int epoch = 0;              // 1-based
  double train_loss = 0;      // mean of the batch losses
  double seconds = 0;         // training only, evaluation excluded
  double images_per_second = 0;
  std::optional<Evaluation> val, test;
};

class TrainLoop;

// Hooks into the loop; override what you need. `step` counts batches from 0 in an epoch.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_epoch_begin(TrainLoop& loop, int epoch) {}
  virtual void on_epoch_end(TrainLoop& loop, const EpochResult& result) {}
  virtual void on_batch_begin(TrainLoop& loop, int64_t step) {}
  virtual void on_after_optimizer_step(TrainLoop& loop, int64_t step) {}
  virtual void on_batch_end(TrainLoop& loop, int64_t step, double loss) {}
};

struct TrainLoopOptions {
  std::shared_ptr<Strategy> strategy;  // null: SingleDevice, on the model's device
  std::string checkpoint_path;  // written after every epoch when not empty (by the main process)
  // Written into every checkpoint's metadata beside the loop's own entries (a program's
  // run configuration: weft-train records its flags and checks them on resume). Keys must
  // not be the loop's: "format", "epoch", "rng.*", "optimizer.*".
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
  // fit(3) trains epochs 2 and 3. A NaN or infinite loss stops it with "training diverged"
  // (seen when a step's loss is read for the progress display or a callback, else in the
  // epoch's sum at its end: no extra read-back per step), before that epoch's checkpoint.
  std::vector<EpochResult> fit(int epochs);
  Evaluation evaluate(data::DataLoader& loader);
  // The test loader given at construction (as the strategy shards it), as fit() evaluates it
  // after an epoch; nullopt without one.
  std::optional<Evaluation> evaluate_test();
  void add_callback(std::shared_ptr<Callback> callback) { callbacks_.push_back(std::move(callback)); }

  // Refuses (throws, leaving `path` as it was) when a weight is NaN or infinite.
  void save_checkpoint(const std::string& path) const;
  void resume(const std::string& path);

  int epoch() const { return epoch_; }  // epochs completed
  nn::Module& model() { return *model_; }  // as given (unwrapped): what checkpoints hold
  Strategy& strategy() { return *strategy_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const TrainLoopOptions& options() const { return options_; }

 private:
  EpochResult train_epoch(int epoch, int epochs);
  // Throws "training diverged: ..." when `loss` is NaN or infinite (`where`: which loss).
  void check_finite_loss(double loss, int epoch, const std::string& where) const;

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<Strategy> strategy_;
  std::shared_ptr<nn::Module> runner_;  // what the strategy made of model_: forward goes through it
  std::shared_ptr<data::DataLoader> train_loader_, val_loader_, test_loader_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  Criterion criterion_;
  TrainLoopOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  int epoch_ = 0;
};

}  // namespace weft::train
