// The CUDA backend's start: registers its allocators, copies and kernels with core.
//
// core/ knows nothing of CUDA (DESIGN.md). On first use of a CUDA device, or of
// cuda_available(), core calls start_backend() once; it discovers the GPUs and, when
// there are any, fills the CUDA entry of every DispatchStub through the register_*
// functions below, one per kernel file. A static library would drop self-registering
// objects that nothing references; this explicit list keeps every kernel file linked.
#pragma once

#include <string>

namespace weft::cuda {

// "" when CUDA devices can be used, else the reason (no driver, no GPU, ...).
std::string start_backend();

void register_copy_kernels();         // copy.cu: copy_, fill_, host <-> device copies
void register_elementwise_kernels();  // elementwise.cu
void register_random_kernels();       // random.cu
void register_dropout_kernels();      // dropout.cu
void register_reduce_kernels();       // reduce.cu
void register_softmax_kernels();      // softmax.cu
void register_loss_kernels();         // loss.cu
void register_index_kernels();        // index_ops.cu
void register_optim_kernels();        // optim.cu
void register_matmul_kernels();       // matmul.cpp (cuBLAS)
void register_conv_kernels();         // conv.cpp (cuDNN)
void register_pooling_kernels();      // pooling_kernels.cu
void register_batch_norm_kernels();   // batch_norm_kernels.cu

}  // namespace weft::cuda
