// MLP: a multi-layer perceptron over flattened images, a light model for weft-train.
//
// PyTorch equivalent (same state_dict names and shapes):
//
//   class MLP(nn.Module):
//       def __init__(self, in_features=784, hidden=(256, 128), num_classes=10, dropout=0.0):
//           super().__init__()
//           self.flatten = nn.Flatten()
//           layers, width = [], in_features
//           for h in hidden:
//               layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
//               width = h
//           layers.append(nn.Linear(width, num_classes))
//           self.layers = nn.Sequential(*layers)
//       def forward(self, x):
//           return self.layers(self.flatten(x))
//
// With the defaults: layers.0.weight [256, 784], layers.0.bias [256], layers.3.weight
// [128, 256], layers.3.bias [128], layers.6.weight [10, 128], layers.6.bias [10]. The
// Dropout is there even with p = 0, so that the names do not depend on p.
#pragma once

#include <cstdint>
#include <vector>

#include "core/generator.h"
#include "nn/module.h"

namespace weft::nn {

class MLP : public Cloneable<MLP> {
 public:
  // Initial weights are drawn from `gen` (the default generator when null), which need not
  // outlive the constructor; dropout masks come from the default generator.
  explicit MLP(int64_t in_features = 784, const std::vector<int64_t>& hidden = {256, 128}, int64_t num_classes = 10,
               double dropout = 0.0, Generator* gen = nullptr);

  // input [N, ...] with in_features values per sample -> logits [N, num_classes].
  Tensor forward(const Tensor& input) override;

 private:
  int64_t in_features_;
};

}  // namespace weft::nn
