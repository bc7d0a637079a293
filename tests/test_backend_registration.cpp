// Every kernel signature has a CUDA kernel once the backend's register_* functions have
// run. They only fill DispatchStub tables (no CUDA call), so this runs without a GPU and
// catches a stub that a GPU run would otherwise find missing ("no kernel for cuda").
#include <doctest/doctest.h>

#include <weft.h>

#include "core/copy.h"
#include "core/generator.h"
#include "kernels/batch_norm_kernels.h"
#include "kernels/conv_kernels.h"
#include "kernels/dropout_kernels.h"
#include "kernels/elementwise_kernels.h"
#include "kernels/index_ops_kernels.h"
#include "kernels/linalg_kernels.h"
#include "kernels/loss_kernels.h"
#include "kernels/optim_kernels.h"
#include "kernels/pooling_kernels.h"
#include "kernels/reduce_kernels.h"
#include "kernels/softmax_kernels.h"

#ifdef WEFT_WITH_CUDA
#include "kernels/cuda/backend.h"
#endif

using namespace weft;

TEST_CASE("every DispatchStub gets a CUDA kernel from the backend") {
#ifndef WEFT_WITH_CUDA
  MESSAGE("skipped: built without the CUDA backend");
#else
  cuda::register_copy_kernels();
  cuda::register_elementwise_kernels();
  cuda::register_random_kernels();
  cuda::register_dropout_kernels();
  cuda::register_reduce_kernels();
  cuda::register_softmax_kernels();
  cuda::register_loss_kernels();
  cuda::register_index_kernels();
  cuda::register_optim_kernels();
  cuda::register_matmul_kernels();
  cuda::register_conv_kernels();
  cuda::register_pooling_kernels();
  cuda::register_batch_norm_kernels();
#define CHECK_HAS_CUDA(stub) CHECK_MESSAGE(stub.has(DeviceType::CUDA), #stub " has no CUDA kernel")
  CHECK_HAS_CUDA(copy_stub);
  CHECK_HAS_CUDA(fill_stub);
  CHECK_HAS_CUDA(random_stub);
  CHECK_HAS_CUDA(binary_stub);
  CHECK_HAS_CUDA(unary_stub);
  CHECK_HAS_CUDA(where_stub);
  CHECK_HAS_CUDA(dropout_stub);
  CHECK_HAS_CUDA(reduce_stub);
  CHECK_HAS_CUDA(softmax_stub);
  CHECK_HAS_CUDA(softmax_backward_stub);
  CHECK_HAS_CUDA(nll_loss_stub);
  CHECK_HAS_CUDA(nll_loss_backward_stub);
  CHECK_HAS_CUDA(cross_entropy_stub);
  CHECK_HAS_CUDA(cross_entropy_backward_stub);
  CHECK_HAS_CUDA(mse_loss_stub);
  CHECK_HAS_CUDA(mse_loss_backward_stub);
  CHECK_HAS_CUDA(index_range_stub);
  CHECK_HAS_CUDA(index_select_stub);
  CHECK_HAS_CUDA(index_add_stub);
  CHECK_HAS_CUDA(gather_stub);
  CHECK_HAS_CUDA(scatter_add_stub);
  CHECK_HAS_CUDA(sgd_step_stub);
  CHECK_HAS_CUDA(adam_step_stub);
  CHECK_HAS_CUDA(norm_power_sum_stub);
  CHECK_HAS_CUDA(multi_tensor_scale_stub);
  CHECK_HAS_CUDA(matmul_stub);
  CHECK_HAS_CUDA(conv2d_forward_stub);
  CHECK_HAS_CUDA(conv2d_backward_stub);
  CHECK_HAS_CUDA(max_pool2d_stub);
  CHECK_HAS_CUDA(max_pool2d_backward_stub);
  CHECK_HAS_CUDA(avg_pool2d_stub);
  CHECK_HAS_CUDA(avg_pool2d_backward_stub);
  CHECK_HAS_CUDA(adaptive_avg_pool2d_stub);
  CHECK_HAS_CUDA(adaptive_avg_pool2d_backward_stub);
  CHECK_HAS_CUDA(batch_norm_stats_stub);
  CHECK_HAS_CUDA(batch_norm_forward_stub);
  CHECK_HAS_CUDA(batch_norm_backward_stub);
#undef CHECK_HAS_CUDA
#endif
}
