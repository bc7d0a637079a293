// The CUDA backend: its DeviceBackend (core/device_backend.h) and its kernels' registration.
//
// core/ knows nothing of CUDA (docs/design.md). backend.cpp registers a DeviceBackend for CUDA
// at static initialisation; on first use of a CUDA device, or of cuda_available(), core
// starts it once: it discovers the GPUs and, when there are any, fills the CUDA entry of
// every DispatchStub through the register_* functions below, one per kernel file. A static
// library would drop self-registering objects that nothing references: CMake links every
// program with --undefined=weft_cuda_backend_registered, which keeps backend.cpp, and its
// explicit list keeps every kernel file.
#pragma once

#include "core/tensor.h"

namespace weft::cuda {

// Every register_* function below, in order (no CUDA call: it only fills tables).
void register_kernels();

void register_copy_kernels();         // copy.cu: copy_, fill_
void register_elementwise_kernels();  // elementwise.cu
void register_random_kernels();       // random.cu
void register_dropout_kernels();      // dropout.cu
void register_reduce_kernels();       // reduce.cu
void register_softmax_kernels();      // softmax.cu
void register_attention_kernels();    // attention.cu
void register_loss_kernels();         // loss.cu
void register_index_kernels();        // index_ops.cu
void register_optim_kernels();        // optim.cu
void register_matmul_kernels();       // matmul.cpp (cuBLAS)
void register_conv_kernels();         // conv.cpp (cuDNN)
void register_pooling_kernels();      // pooling_kernels.cu
void register_batch_norm_kernels();   // batch_norm_kernels.cu
void register_layer_norm_kernels();   // layer_norm.cu

// Host <-> device (copy.cu): both contiguous with one dtype and shape.
void copy_with_host(const Tensor& src, const Tensor& dst);

}  // namespace weft::cuda
