// The CPU kernels' registration: each kernel file fills its entries of the DispatchStubs.
//
// register_kernels() runs at static initialisation (kernels/register_kernels.cpp), before
// any op can be called. As in kernels/cuda/backend.h, the explicit list is also what keeps
// every kernel file linked from a static library.
#pragma once

namespace weft::cpu {

// Every function below, in order.
void register_kernels();

void register_copy_kernels();         // copy.cpp: copy_, fill_
void register_elementwise_kernels();  // elementwise.cpp
void register_random_kernels();       // random.cpp
void register_dropout_kernels();      // dropout.cpp
void register_reduce_kernels();       // reduce.cpp
void register_softmax_kernels();      // softmax.cpp
void register_attention_kernels();    // attention.cpp
void register_loss_kernels();         // loss.cpp
void register_index_kernels();        // index_ops.cpp
void register_optim_kernels();        // optim.cpp
void register_matmul_kernels();       // matmul.cpp
void register_conv_kernels();         // conv.cpp
void register_pooling_kernels();      // pooling.cpp
void register_batch_norm_kernels();   // batch_norm.cpp
void register_layer_norm_kernels();   // layer_norm.cpp

}  // namespace weft::cpu
