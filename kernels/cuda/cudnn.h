// cuDNN in weft: the status check, this thread's handle, and owning descriptors
// (CUDA-only header).
//
// cuDNN's legacy API describes every operand with a descriptor object that must be
// created and destroyed; the classes below own one each, so an op that throws halfway
// leaks nothing. Sizes are int in that API: the constructors check that they fit.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/conv_kernels.h"
#include "kernels/cuda/check.h"

namespace weft::cuda {

// So that WEFT_CUDA_CHECK(cudnn...(...)) reports cuDNN's status and its last error text.
void check_status(cudnnStatus_t status, const char* what, const char* file, int line);

// This thread's cuDNN handle for the GPU of `device`, bound to the current stream of
// `device`. The caller holds a DeviceGuard for `device`.
cudnnHandle_t cudnn_handle(Device device);

// CUDNN_DATA_FLOAT or CUDNN_DATA_DOUBLE; an error for any other dtype.
cudnnDataType_t cudnn_dtype(DType dtype);

// `value` as an int for cuDNN, or an error naming `what` (a size beyond cuDNN's range).
int cudnn_int(int64_t value, const char* what);

// One cuDNN descriptor, created with the object and destroyed with it.
template <class D, cudnnStatus_t (*Create)(D*), cudnnStatus_t (*Destroy)(D)>
class Descriptor {
 public:
  Descriptor() { WEFT_CUDA_CHECK(Create(&desc_)); }
  ~Descriptor() { Destroy(desc_); }  // a failure here has nowhere to go; destructors never throw
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  D get() const { return desc_; }

 private:
  D desc_ = nullptr;
};

// A contiguous NCHW tensor of `dtype` with sizes {n, c, h, w}.
class TensorDescriptor
    : public Descriptor<cudnnTensorDescriptor_t, &cudnnCreateTensorDescriptor, &cudnnDestroyTensorDescriptor> {
 public:
  TensorDescriptor(DType dtype, const std::array<int64_t, 4>& sizes);
};

// Convolution weights [out_channels, in_channels / groups, kH, kW], contiguous.
class FilterDescriptor
    : public Descriptor<cudnnFilterDescriptor_t, &cudnnCreateFilterDescriptor, &cudnnDestroyFilterDescriptor> {
 public:
  FilterDescriptor(DType dtype, const std::array<int64_t, 4>& sizes);
};

// A 2-d cross-correlation (what deep learning calls convolution) computed in `dtype`.
class ConvolutionDescriptor : public Descriptor<cudnnConvolutionDescriptor_t, &cudnnCreateConvolutionDescriptor,
                                                &cudnnDestroyConvolutionDescriptor> {
 public:
  ConvolutionDescriptor(const Conv2dParams& params, DType dtype);
  void set_math_type(cudnnMathType_t math) const;
};

}  // namespace weft::cuda
