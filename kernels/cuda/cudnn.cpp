// cuDNN handles per (GPU, thread), the status check and the descriptor classes.
#include "kernels/cuda/cudnn.h"

#include <climits>

#include "core/error.h"
#include "kernels/cuda/handle_pool.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

namespace weft::cuda {

void check_status(cudnnStatus_t status, const char* what, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) [[likely]] return;
  // cuDNN 9 keeps a description of the last failure on this thread: often the only text
  // that says which argument it refused.
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  WEFT_FAIL("cuDNN error ", cudnnGetErrorString(status), " in ", what, " at ", file, ":", line,
            detail[0] != '\0' ? " (" : "", detail, detail[0] != '\0' ? ")" : "");
}

namespace {

cudnnHandle_t create_handle() {
  cudnnHandle_t handle = nullptr;
  WEFT_CUDA_CHECK(cudnnCreate(&handle));
  return handle;
}

using CudnnPool = HandlePool<cudnnHandle_t, &create_handle>;

}  // namespace

cudnnHandle_t cudnn_handle(Device device) {
  cudnnHandle_t handle = CudnnPool::get(physical_device(device));
  WEFT_CUDA_CHECK(cudnnSetStream(handle, current_native_stream(device)));
  return handle;
}

cudnnDataType_t cudnn_dtype(DType dtype) {
  if (dtype == DType::Float32) return CUDNN_DATA_FLOAT;
  if (dtype == DType::Float64) return CUDNN_DATA_DOUBLE;
  WEFT_FAIL("cuDNN: dtype ", dtype_name(dtype), " is not supported (expected float32 or float64)");
}

int cudnn_int(int64_t value, const char* what) {
  WEFT_CHECK(value >= 0 && value <= INT_MAX, "cuDNN: ", what, " = ", value,
             " is beyond the range of cuDNN's legacy API (at most ", INT_MAX, ")");
  return static_cast<int>(value);
}

TensorDescriptor::TensorDescriptor(DType dtype, const std::array<int64_t, 4>& s) {
  WEFT_CUDA_CHECK(cudnnSetTensor4dDescriptor(get(), CUDNN_TENSOR_NCHW, cudnn_dtype(dtype), cudnn_int(s[0], "batch"),
                                             cudnn_int(s[1], "channels"), cudnn_int(s[2], "height"),
                                             cudnn_int(s[3], "width")));
}

FilterDescriptor::FilterDescriptor(DType dtype, const std::array<int64_t, 4>& s) {
  WEFT_CUDA_CHECK(cudnnSetFilter4dDescriptor(get(), cudnn_dtype(dtype), CUDNN_TENSOR_NCHW,
                                             cudnn_int(s[0], "out_channels"), cudnn_int(s[1], "in_channels / groups"),
                                             cudnn_int(s[2], "kernel height"), cudnn_int(s[3], "kernel width")));
}

ConvolutionDescriptor::ConvolutionDescriptor(const Conv2dParams& p, DType dtype) {
  WEFT_CUDA_CHECK(cudnnSetConvolution2dDescriptor(
      get(), cudnn_int(p.padding[0], "padding"), cudnn_int(p.padding[1], "padding"), cudnn_int(p.stride[0], "stride"),
      cudnn_int(p.stride[1], "stride"), cudnn_int(p.dilation[0], "dilation"), cudnn_int(p.dilation[1], "dilation"),
      CUDNN_CROSS_CORRELATION, cudnn_dtype(dtype)));
  WEFT_CUDA_CHECK(cudnnSetConvolutionGroupCount(get(), cudnn_int(p.groups, "groups")));
}

void ConvolutionDescriptor::set_math_type(cudnnMathType_t math) const {
  WEFT_CUDA_CHECK(cudnnSetConvolutionMathType(get(), math));
}

}  // namespace weft::cuda
