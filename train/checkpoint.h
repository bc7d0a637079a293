// Checkpoint: the TrainLoop's state as one file, and the rules for reading it back.
//
// One safetensors file: "model.<name>" and "optimizer.<name>" tensors; metadata holds
// the epoch, the unfinished epoch's position and partial totals ("epoch_samples",
// "epoch_loss_sum", "epoch_batches": Note [Mid-epoch checkpoints]; a checkpoint without
// them is at an epoch's end), the optimizer's scalars, the scheduler's ("scheduler" = its
// name, "scheduler.<key>"), every default generator's state as "rng.<device>.seed" and
// "rng.<device>.offset", and options.checkpoint_metadata. Doubles are written with 17
// significant digits, which reads back to the same double. The strategy's state, if it keeps
// one, is "strategy.<key>" (local SGD's step count). Format 1 (one generator:
// "rng.seed", "rng.offset", for cpu:0) is still read.
//
// read_checkpoint checks the file's own form (every entry parses, names a device, fits its
// type) and check_resumable checks it against the loop that would resume from it, so that a
// resume that fails has changed nothing; restore_checkpoint then applies it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "nn/module.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/optimizer.h"
#include "train/strategy.h"

namespace weft::train {

struct GeneratorState {
  Device device;
  uint64_t seed = 0, offset = 0;
};

struct Checkpoint {
  int epoch = 0;  // epochs complete
  // The unfinished epoch's position and partial totals (Note [Mid-epoch checkpoints] in
  // train_loop.h); 0 at an epoch's end.
  int64_t epoch_samples = 0, epoch_batches = 0;
  double epoch_loss_sum = 0;
  std::string epoch_order;  // the sampler's global_order() that epoch_samples counts in; "" for none
  nn::NamedTensors model;
  optim::OptimizerState optimizer;
  std::optional<std::string> scheduler;  // the scheduler's name, where the loop had one
  std::map<std::string, double> scheduler_state, strategy_state;
  std::vector<GeneratorState> generators;  // every default generator's
  // The program's own entries (TrainLoopOptions::checkpoint_metadata): every metadata entry
  // that is not the loop's (is_checkpoint_metadata).
  std::map<std::string, std::string> metadata;
};

// Whether the loop writes `key` itself (a program's own metadata may not use it).
bool is_checkpoint_metadata(const std::string& key);

// Writes `checkpoint` to `path` (atomically: a reader sees the old file or the new one).
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);

// Reads `path`; an error names the file and the entry at fault (not a weft checkpoint, an
// unexpected tensor, metadata that does not parse or is out of range).
Checkpoint read_checkpoint(const std::string& path);

// Throws, naming `path`, where `checkpoint` cannot resume a loop with `scheduler` (null: none)
// and `strategy`: a scheduler saved or not saved, of another kind, or a state either refuses.
// Changes nothing.
void check_resumable(const Checkpoint& checkpoint, const std::string& path, const optim::LRScheduler* scheduler,
                     const Strategy& strategy);

// Loads `checkpoint` into the model, the optimizer, the strategy, the scheduler (if any) and
// the default generators, after check_resumable.
void restore_checkpoint(const Checkpoint& checkpoint, nn::Module& model, optim::Optimizer& optimizer,
                        Strategy& strategy, optim::LRScheduler* scheduler);

}  // namespace weft::train
