// Headers that describe the tensors sent after them; see tensor_header.h.
#include "parallel/pipeline/tensor_header.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace weft::parallel::pipeline {

Tensor tensor_header(const Tensor& t, Device device) {
  std::vector<int64_t> header(kHeaderLength, 0);
  header[1] = -1;
  if (t.defined() && t.dim() <= kMaxHeaderDims) {
    header[0] = static_cast<int64_t>(t.dtype());
    header[1] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) header[2 + d] = t.size(d);
  }
  return tensor(header, Shape{kHeaderLength}).to(device);
}

std::optional<Tensor> empty_from_header(const Tensor& header, Device device, const std::string& who) {
  const std::vector<int64_t> h = header.to(kCPU).to_vector<int64_t>();
  WEFT_CHECK(h.size() == static_cast<size_t>(kHeaderLength) && h[1] >= -1 && h[1] <= kMaxHeaderDims, who,
             " got a bad header (", h.size() > 1 ? h[1] : -2, " dims)");
  WEFT_CHECK(h[0] >= 0 && h[0] < kNumDTypes, who, " got a bad header (dtype ", h[0], ")");
  if (h[1] == -1) return std::nullopt;
  Shape shape;
  for (int64_t d = 0; d < h[1]; ++d) {
    WEFT_CHECK(h[2 + d] >= 0, who, " got a bad header (size ", h[2 + d], " in dim ", d, ")");
    shape.push_back(h[2 + d]);
  }
  return empty(shape, TensorOptions(static_cast<DType>(h[0]), device));
}

}  // namespace weft::parallel::pipeline
