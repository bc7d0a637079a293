// A small ResNet (He et al. 2016, the CIFAR-style variant) for 1x28x28 or 3x32x32 images:
// the heavier GPU workload of weft-train, with batch norm in every block.
//
// Names follow torchvision's resnet.py, so a PyTorch model built the same way has the
// same state_dict:
//   conv1 (3x3, in_channels -> 16, no bias), bn1, relu,
//   layer1 .. layer3: BasicBlocks of widths 16, 32, 64; the first block of layer2 and
//     layer3 has stride 2 and a "downsample" shortcut = Sequential(1x1 conv, no bias, BN),
//   avgpool (adaptive, to 1x1), fc (64 -> num_classes).
// A BasicBlock: conv1 (3x3, stride), bn1, relu, conv2 (3x3), bn2, [downsample];
//   out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
// e.g. layer2.0.conv1.weight [32, 16, 3, 3], layer2.0.downsample.0.weight [32, 16, 1, 1],
// layer2.0.downsample.1.running_mean [32].
//
// Initialisation as torchvision's: convolutions by kaiming_normal_(mode = fan_out,
// nonlinearity = relu), batch norms weight 1 and bias 0, fc as Linear's default.
#pragma once

#include <cstdint>
#include <vector>

#include "core/generator.h"
#include "nn/module.h"
#include "nn/sequential.h"

namespace weft::nn {

class BasicBlock : public Cloneable<BasicBlock> {
 public:
  // A 1x1-conv + BN shortcut is made when stride != 1 or in_planes != planes; the
  // identity otherwise.
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1, Generator* gen = nullptr);

  Tensor forward(const Tensor& input) override;
};

class ResNet : public Cloneable<ResNet> {
 public:
  // blocks_per_stage: how many BasicBlocks each of the three stages has.
  explicit ResNet(int64_t in_channels = 1, int64_t num_classes = 10,
                  const std::vector<int64_t>& blocks_per_stage = {2, 2, 2}, Generator* gen = nullptr);

  // input [N, in_channels, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& input) override;
  // The same layers (shared, not copied) as a Sequential that computes the same function:
  // conv1, bn1, relu, layer1, layer2, layer3, avgpool, flatten, fc; its state_dict names
  // are this model's. For pipelines.
  std::shared_ptr<Sequential> as_sequential() const override;
};

}  // namespace weft::nn
