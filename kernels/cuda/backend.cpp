// Starts the CUDA backend: allocators, copies and every kernel family (see backend.h).
#include "kernels/cuda/backend.h"

#include "core/allocator.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

std::string start_backend() {
  if (!is_available()) return unavailable_reason();
  register_allocator_factory(DeviceType::CUDA, [](Device device) -> Allocator& { return caching_allocator(device); });
  register_pinned_allocator(&pinned_host_allocator());
  register_copy_kernels();
  register_elementwise_kernels();
  register_random_kernels();
  register_dropout_kernels();
  register_reduce_kernels();
  register_softmax_kernels();
  register_loss_kernels();
  register_index_kernels();
  register_optim_kernels();
  register_matmul_kernels();
  register_conv_kernels();
  register_pooling_kernels();
  register_batch_norm_kernels();
  return "";
}

}  // namespace weft::cuda
