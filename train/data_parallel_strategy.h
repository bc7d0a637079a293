// DataParallelStrategy: the TrainLoop's 'dp' mode (one process, several devices).
//
// The model is moved to devices[0] and wrapped in parallel::DataParallel over the devices:
// batches are delivered to devices[0], each step scatters them across the devices, runs
// the replicas at once and gathers the outputs back on devices[0], where the loss is taken;
// backward sums every replica's gradient into the model's parameters, and one optimizer
// steps them on devices[0]. Evaluation goes through DataParallel too. One process, so the
// epoch's totals need no reduction and this process logs and checkpoints; checkpoints hold
// the unwrapped model, so they load into a single-device run and the other way round.
#pragma once

#include <memory>
#include <vector>

#include "parallel/local/data_parallel.h"
#include "train/strategy.h"

namespace weft::train {

class DataParallelStrategy final : public Strategy {
 public:
  // Distinct devices of one type (the first is where the model, the batches and the loss live).
  explicit DataParallelStrategy(std::vector<Device> devices);

  ParallelMode mode() const override { return ParallelMode::DataParallel; }
  int world_size() const override { return static_cast<int>(devices_.size()); }
  Device input_device() const override { return devices_[0]; }

  const std::vector<Device>& devices() const { return devices_; }

 private:
  std::shared_ptr<nn::Module> prepare_model(std::shared_ptr<nn::Module> model) override;
  std::vector<Device> devices_;
};

}  // namespace weft::train
