// DataParallelStrategy: move the model to the first device and wrap it.
#include "train/data_parallel_strategy.h"

#include "core/error.h"

namespace weft::train {

DataParallelStrategy::DataParallelStrategy(std::vector<Device> devices) : devices_(std::move(devices)) {
  WEFT_CHECK(!devices_.empty(), "DataParallelStrategy: no devices given");
}

std::shared_ptr<nn::Module> DataParallelStrategy::prepare_model(std::shared_ptr<nn::Module> model) {
  model->to(devices_[0]);
  return std::make_shared<parallel::DataParallel>(std::move(model), devices_);
}

}  // namespace weft::train
