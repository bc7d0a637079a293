// The CUDA DeviceBackend: starts the runtime and the kernels, and forwards core's memory,
// stream, event and copy requests to the CUDA runtime (see backend.h).
#include "kernels/cuda/backend.h"

#include "core/device_backend.h"
#include "kernels/cuda/device_error.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

namespace weft::cuda {

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

namespace {

cudaStream_t as_stream(void* handle) { return static_cast<cudaStream_t>(handle); }
cudaEvent_t as_event(void* handle) { return static_cast<cudaEvent_t>(handle); }

class CudaBackend final : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }

  std::string start() override {
    if (!is_available()) return unavailable_reason();
    register_kernels();
    return "";
  }
  int device_count() override { return cuda::device_count(); }
  int physical_device_count() override { return cuda::physical_device_count(); }

  Allocator& allocator(Device device) override { return device_allocator(device); }
  Allocator* pinned_allocator() override { return &pinned_host_allocator(); }
  void copy_with_host(const Tensor& src, const Tensor& dst) override { cuda::copy_with_host(src, dst); }

  void* default_stream(Device device) override { return compute_stream_handle(device); }
  void* upload_stream(Device device) override { return upload_stream_handle(device); }
  void* new_stream(Device device) override { return new_stream_handle(device); }
  // Every synchronisation that core asks for (Stream, Event and device synchronize, and
  // through them item() and copies to the host) raises the device-side errors that
  // kernels recorded (Note [Device-side errors]).
  void synchronize_stream(Device device, void* stream) override {
    cuda::synchronize_stream(device, as_stream(stream));
    raise_pending_device_error();
  }
  bool query_stream(Device, void* stream) override { return cuda::query_stream(as_stream(stream)); }
  void synchronize_device(Device device) override {
    cuda::synchronize(device);
    raise_pending_device_error();
  }

  void* create_event(Device device, bool timing) override { return cuda::create_event(device, timing); }
  void destroy_event(void* event) noexcept override { cuda::destroy_event(as_event(event)); }
  void record_event(void* event, Device device, void* stream) override {
    cuda::record_event(as_event(event), device, as_stream(stream));
  }
  void block_on_event(void* event, Device device, void* stream) override {
    cuda::block_on_event(as_event(event), device, as_stream(stream));
  }
  bool query_event(void* event) override { return cuda::query_event(as_event(event)); }
  void synchronize_event(void* event) override {
    cuda::synchronize_event(as_event(event));
    raise_pending_device_error();
  }
  float elapsed_ms(void* start, void* end) override { return cuda::elapsed_ms(as_event(start), as_event(end)); }
  void record_stream(const Tensor& t, Device device, void* stream) override {
    cuda::record_stream(t, Stream(device, stream));
  }
};

bool register_backend() {
  static CudaBackend backend;
  register_device_backend(backend);
  return true;
}

}  // namespace

}  // namespace weft::cuda

extern "C" {
// The anchor the linker is told to keep (backend.h); its initialiser registers the backend.
extern const bool weft_cuda_backend_registered;
const bool weft_cuda_backend_registered = weft::cuda::register_backend();
}
