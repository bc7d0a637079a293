// Balancing a pipeline's stages by what their layers cost (torchgpipe's balance_by_time).
//
// A pipeline runs at the pace of its slowest stage: split by layer count, the ConvNet puts
// both convolutions on the first stage and one Linear on the second, which then waits most
// of the time. These measure each layer instead and cut where the costs even out:
//
//   Tensor sample = images.slice(0, 0, 25);                  // one micro-batch's input
//   parallel::pipeline::Pipeline pipe(model, {.devices = {Device("cpu:0"), Device("cpu:1")},
//                                             .balance_by = parallel::pipeline::by_time(sample),
//                                             .micro_batches = 4});
//   pipe.balance();                                          // e.g. {1, 3}: layer1 | layer2, flatten, fc
//
// layer_times copies the layers to `device` one at a time (a pipeline's model need not fit one
// device), runs `rounds` forward and backward passes of each on what the layers before it
// made of `sample` (one warm-up first), and takes each layer's median. The model itself, its
// gradients and its buffers (BatchNorm's statistics) are left as they were, and so are the
// generators dropout draws from (nn::forward_generators). The layers keep the model's mode:
// train() it first to time what training runs. As in a pipeline, the first layer's input gets
// no gradient and every other layer's does; a layer's backward starts from a gradient of ones.
//
// balance_by_cost is exact: of all the ways to cut the layers into `stages` runs of at
// least one layer, it takes one whose largest run costs least; of those, the most even one
// (the least sum of squared stage costs); of those, the one whose last cut is latest, and so
// on back. So equal costs split as the layer count splits them, the first stages the longer.
//
// A Balancer is what the pipelines take as `balance_by`: the balance for a model, a number
// of stages and the device to measure on. Pipeline calls it once with its first device;
// DistributedPipeline calls it on rank 0 only (with rank 0's device) and sends the result to
// the other ranks, since measured times differ from process to process and every rank must
// split alike.
#pragma once

#include <functional>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/sequential.h"

namespace weft::parallel::pipeline {

using Balancer = std::function<std::vector<size_t>(const nn::Sequential& model, int stages, Device device)>;

// Seconds per layer of `model` (forward + backward on a micro-batch like `sample`), the
// median of `rounds` measurements on `device`.
std::vector<double> layer_times(const nn::Sequential& model, const Tensor& sample, Device device, int rounds = 5);

// Layers per stage (summing to costs.size()) that minimise the largest stage's total cost.
std::vector<size_t> balance_by_cost(const std::vector<double>& costs, int stages);

// balance_by_cost(layer_times(model, sample, device, rounds), stages).
std::vector<size_t> balance_by_time(const nn::Sequential& model, const Tensor& sample, int stages, Device device,
                                    int rounds = 5);

// A Balancer that calls balance_by_time with this sample.
Balancer by_time(Tensor sample, int rounds = 5);

}  // namespace weft::parallel::pipeline
