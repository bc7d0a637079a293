// Registers every CPU kernel (see backend.h).
#include "kernels/cpu/backend.h"

namespace weft::cpu {

void register_kernels() {
  register_copy_kernels();
  register_elementwise_kernels();
  register_random_kernels();
  register_dropout_kernels();
  register_reduce_kernels();
  register_softmax_kernels();
  register_attention_kernels();
  register_loss_kernels();
  register_index_kernels();
  register_optim_kernels();
  register_matmul_kernels();
  register_conv_kernels();
  register_pooling_kernels();
  register_batch_norm_kernels();
  register_layer_norm_kernels();
}

}  // namespace weft::cpu
