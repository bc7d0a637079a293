// DataParallel: one module, one process, a batch split across several devices (PyTorch's
// torch.nn.DataParallel).
//
//   auto model = std::make_shared<nn::ConvNet>();
//   model->to(Device("cuda:0"));
//   auto dp = std::make_shared<parallel::DataParallel>(model, std::vector<Device>{Device("cuda:0"), Device("cuda:1")});
//   Tensor loss = cross_entropy((*dp)(images), labels.to(Device("cuda:0")));
//   loss.backward();   // the gradients land in model's parameters, on cuda:0
//
// forward(input): scatter the input along `dim` into chunks of ceil(B / n) (5 samples on
// 4 devices: 2, 2, 1 on three devices), replicate the module onto as many devices as
// there are chunks, run the replicas at once (parallel_apply), and gather their outputs on
// output_device. All of it is differentiable, so backward sums every replica's gradient
// into the module's parameters. With one device the module is called directly on the
// input moved there. The module must live on device_ids[0].
//
// As in PyTorch: `state_dict()` keys are the module's with "module." in front, `module()`
// is the wrapped module; BatchNorm in training mode normalises each chunk with the chunk's
// own statistics (not the whole batch's), and only replica 0's running-statistics updates
// reach the module, so a DataParallel run with BatchNorm in training mode is not equivalent
// to one device with the whole batch (DistributedDataParallel with SyncBatchNorm is the
// usual answer; weft has neither yet).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "nn/module.h"

namespace weft::parallel {

class DataParallel : public nn::Cloneable<DataParallel> {
 public:
  // device_ids: distinct devices of one type; empty means every logical CUDA device when
  // there is a GPU, else the module's device alone. output_device defaults to
  // device_ids[0].
  explicit DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> device_ids = {},
                        std::optional<Device> output_device = std::nullopt, int64_t dim = 0);

  Tensor forward(const Tensor& input) override;

  nn::Module& module() const { return child("module"); }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  Device output_device() const { return output_device_; }
  int64_t dim() const { return dim_; }
  std::string extra_repr() const override;

 private:
  std::vector<Device> device_ids_;
  Device output_device_;
  int64_t dim_;
};

// Parses "cpu:0,cpu:1" or "cuda:0,cuda:1" into distinct devices of one type; an error
// names the entry at fault.
std::vector<Device> parse_device_list(const std::string& text);

}  // namespace weft::parallel
