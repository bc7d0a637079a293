// Criterion: what a training step minimises. loss = criterion(output, target), reduced to a
// scalar mean over the batch (or over the micro-batch, in a pipeline, which averages the
// micro-batches' losses). The TrainLoop's strategies and the pipelines take one.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace weft::nn {

using Criterion = std::function<Tensor(const Tensor& output, const Tensor& target)>;

}  // namespace weft::nn
