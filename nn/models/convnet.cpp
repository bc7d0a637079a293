// ConvNet: two conv (5x5, padding 2) + ReLU + 2x2 max-pool layers, then one linear layer.
#include "nn/models/convnet.h"

#include <memory>

#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "nn/sequential.h"

namespace weft::nn {

namespace {

std::shared_ptr<Sequential> conv_layer(int64_t in_channels, int64_t out_channels, Generator* gen) {
  return std::make_shared<Sequential>(
      std::make_shared<Conv2d>(in_channels, out_channels, 5, /*stride=*/1, /*padding=*/2, /*dilation=*/1,
                               /*groups=*/1, /*bias=*/true, TensorOptions(), gen),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2, 2));
}

}  // namespace

ConvNet::ConvNet(int64_t num_classes, Generator* gen) : Cloneable("ConvNet"), num_classes_(num_classes) {
  WEFT_CHECK(num_classes > 0, "ConvNet: num_classes must be positive, got ", num_classes);
  register_module("layer1", conv_layer(1, 16, gen));
  register_module("layer2", conv_layer(16, 32, gen));
  register_module("fc", std::make_shared<Linear>(7 * 7 * 32, num_classes, true, TensorOptions(), gen));
}

Tensor ConvNet::forward(const Tensor& input) {
  WEFT_CHECK(input.defined() && input.dim() == 4 && input.size(1) == 1 && input.size(2) == 28 && input.size(3) == 28,
             "ConvNet: expected images of shape [N, 1, 28, 28], got ",
             input.defined() ? input.shape().str() : "an undefined tensor");
  Tensor out = child("layer2")(child("layer1")(input));
  return child("fc")(out.reshape({out.size(0), -1}));
}

std::shared_ptr<Sequential> ConvNet::as_sequential() const {
  return children_as_sequential(*this, "fc");
}

}  // namespace weft::nn
