// ResNet and BasicBlock: torchvision's layout and initialisation at CIFAR scale.
#include "nn/models/resnet.h"

#include <memory>
#include <string>

#include "kernels/elementwise.h"
#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "nn/sequential.h"

namespace weft::nn {

namespace {

constexpr int64_t kStageWidths[] = {16, 32, 64};

// A bias-free convolution with torchvision's He-normal initialisation.
std::shared_ptr<Conv2d> he_conv(int64_t in_planes, int64_t planes, int64_t kernel, int64_t stride, Generator* gen) {
  auto conv = std::make_shared<Conv2d>(in_planes, planes, kernel, stride, /*padding=*/kernel / 2, /*dilation=*/1,
                                       /*groups=*/1, /*bias=*/false, TensorOptions(), gen);
  init::kaiming_normal_(conv->param("weight"), 0.0, init::FanMode::FanOut, init::Nonlinearity::Relu, gen);
  return conv;
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, Generator* gen) : Cloneable("BasicBlock") {
  WEFT_CHECK(in_planes > 0 && planes > 0 && stride > 0,
             "BasicBlock: in_planes, planes and stride must be positive, got ", in_planes, ", ", planes, ", ", stride);
  register_module("conv1", he_conv(in_planes, planes, 3, stride, gen));
  register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  register_module("relu", std::make_shared<ReLU>());
  register_module("conv2", he_conv(planes, planes, 3, 1, gen));
  register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (stride != 1 || in_planes != planes)
    register_module("downsample", std::make_shared<Sequential>(he_conv(in_planes, planes, 1, stride, gen),
                                                               std::make_shared<BatchNorm2d>(planes)));
}

Tensor BasicBlock::forward(const Tensor& input) {
  Module& relu_layer = child("relu");
  Tensor out = relu_layer(child("bn1")(child("conv1")(input)));
  out = child("bn2")(child("conv2")(out));
  const bool has_downsample = named_children().back().first == "downsample";
  return relu_layer(add(out, has_downsample ? child("downsample")(input) : input));
}

ResNet::ResNet(int64_t in_channels, int64_t num_classes, const std::vector<int64_t>& blocks_per_stage, Generator* gen)
    : Cloneable("ResNet") {
  WEFT_CHECK(in_channels > 0 && num_classes > 0, "ResNet: in_channels and num_classes must be positive, got ",
             in_channels, " and ", num_classes);
  WEFT_CHECK(blocks_per_stage.size() == 3, "ResNet: expected the block counts of 3 stages, got ",
             blocks_per_stage.size());
  register_module("conv1", he_conv(in_channels, kStageWidths[0], 3, 1, gen));
  register_module("bn1", std::make_shared<BatchNorm2d>(kStageWidths[0]));
  register_module("relu", std::make_shared<ReLU>());
  int64_t width = kStageWidths[0];
  for (size_t stage = 0; stage < 3; ++stage) {
    WEFT_CHECK(blocks_per_stage[stage] > 0, "ResNet: every stage needs at least one block, stage ", stage + 1,
               " has ", blocks_per_stage[stage]);
    auto layer = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks_per_stage[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      layer->push_back(std::make_shared<BasicBlock>(width, kStageWidths[stage], stride, gen));
      width = kStageWidths[stage];
    }
    register_module("layer" + std::to_string(stage + 1), std::move(layer));
  }
  register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  register_module("fc", std::make_shared<Linear>(width, num_classes, true, TensorOptions(), gen));
}

Tensor ResNet::forward(const Tensor& input) {
  WEFT_CHECK(input.defined() && input.dim() == 4, "ResNet: expected images of shape [N, C, H, W], got ",
             input.defined() ? input.shape().str() : "an undefined tensor");
  Tensor x = child("relu")(child("bn1")(child("conv1")(input)));
  x = child("layer3")(child("layer2")(child("layer1")(x)));
  x = child("avgpool")(x);
  return child("fc")(x.flatten(1));
}

std::shared_ptr<Sequential> ResNet::as_sequential() const {
  return children_as_sequential(*this, "fc");
}

}  // namespace weft::nn
