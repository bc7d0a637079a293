// What a rank needs before it can receive a tensor: its dtype and shape, sent ahead of it as
// a fixed-size int64 message [dtype, dims, size 0 .. size dims-1, zeros], so that the
// receiver allocates the tensor without knowing the model (the pipeline's activations and
// gradients, the last stage's outputs that the TrainLoop's DistributedStrategy broadcasts).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/device.h"
#include "core/tensor.h"

namespace weft::parallel::pipeline {

constexpr int kMaxHeaderDims = 6;
constexpr int64_t kHeaderLength = 2 + kMaxHeaderDims;

// t's header on `device`; for an undefined t, or one of more than kMaxHeaderDims dims, a
// header of -1 dims, which says there is no tensor.
Tensor tensor_header(const Tensor& t, Device device);

// An empty tensor on `device` as the header describes it; nullopt for a header of -1 dims.
// Any other header that no tensor_header gives is an error that begins with `who`.
std::optional<Tensor> empty_from_header(const Tensor& header, Device device, const std::string& who);

}  // namespace weft::parallel::pipeline
