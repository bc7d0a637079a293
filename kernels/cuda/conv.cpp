// CUDA conv2d: cuDNN's convolutions, with the algorithm of each pass chosen by measurement.
//
// Forward, backward-data and backward-filter each have several cuDNN algorithms whose
// speed depends on the shapes. The first call with a given geometry times them all on
// the call's own operands (cudnnFind*AlgorithmEx) with a workspace from weft's caching
// allocator, and caches the fastest acceptable one with its workspace size; later calls
// with that geometry reuse it, so a training step always runs the same algorithms and
// gives the same bits. Acceptable means: deterministic (the CPU promises results that do
// not depend on scheduling, and some backward algorithms accumulate with atomics), and,
// for float32, plain FMA arithmetic unless allow_tf32() is on: cuDNN's default math
// lets Ampere and newer GPUs round float32 operands to TF32, which weft does not do
// unasked. Bias: cudnnAddTensor forward, cudnnConvolutionBackwardBias backward.
//
// cuDNN's legacy API counts elements in int: a batch whose input or output has more than
// INT_MAX elements runs in chunks of samples (grad_weight and grad_bias accumulate
// over the chunks).
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <iostream>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "kernels/conv_kernels.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

// The search's workspace is what the hungriest algorithm asks for, up to this much: an
// algorithm that needs more is simply not among the candidates.
constexpr size_t kMaxSearchWorkspace = size_t(1) << 30;

// One pass's operands. The same three descriptors serve every pass; the pointers are
// the input (or grad_input), weight (or grad_weight) and output (or grad_out) data.
struct ConvCall {
  cudnnHandle_t handle;
  const TensorDescriptor& x;
  const FilterDescriptor& w;
  const ConvolutionDescriptor& conv;
  const TensorDescriptor& y;
  void* x_data;
  void* w_data;
  void* y_data;
  int64_t w_bytes;  // the weight's size: backward-filter searches into scratch of this size
};

struct ForwardPass {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr int kId = 0;  // the pass in ConvKey
  static constexpr int kAlgos = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr const char* kName = "conv2d forward";

  static int max_count(const ConvCall& c) {
    int count = 0;
    WEFT_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(c.handle, &count));
    return count;
  }
  static cudnnStatus_t workspace(const ConvCall& c, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(c.handle, c.x.get(), c.w.get(), c.conv.get(), c.y.get(), algo,
                                                   bytes);
  }
  // The search may write the output: the run that follows overwrites it.
  static void find(const ConvCall& c, Device, int count, int* returned, Perf* results, void* ws, size_t bytes) {
    WEFT_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithmEx(c.handle, c.x.get(), c.x_data, c.w.get(), c.w_data,
                                                           c.conv.get(), c.y.get(), c.y_data, count, returned,
                                                           results, ws, bytes));
  }
  static void run(const ConvCall& c, Algo algo, void* ws, size_t bytes, const void* alpha, const void* beta) {
    WEFT_CUDA_CHECK(cudnnConvolutionForward(c.handle, alpha, c.x.get(), c.x_data, c.w.get(), c.w_data, c.conv.get(),
                                            algo, ws, bytes, beta, c.y.get(), c.y_data));
  }
};

struct BackwardDataPass {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr int kId = 1;
  static constexpr int kAlgos = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static constexpr const char* kName = "conv2d backward (input)";

  static int max_count(const ConvCall& c) {
    int count = 0;
    WEFT_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(c.handle, &count));
    return count;
  }
  static cudnnStatus_t workspace(const ConvCall& c, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(c.handle, c.w.get(), c.y.get(), c.conv.get(), c.x.get(),
                                                        algo, bytes);
  }
  // The search may write grad_input: the run that follows overwrites it.
  static void find(const ConvCall& c, Device, int count, int* returned, Perf* results, void* ws, size_t bytes) {
    WEFT_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(c.handle, c.w.get(), c.w_data, c.y.get(), c.y_data,
                                                                c.conv.get(), c.x.get(), c.x_data, count, returned,
                                                                results, ws, bytes));
  }
  static void run(const ConvCall& c, Algo algo, void* ws, size_t bytes, const void* alpha, const void* beta) {
    WEFT_CUDA_CHECK(cudnnConvolutionBackwardData(c.handle, alpha, c.w.get(), c.w_data, c.y.get(), c.y_data,
                                                 c.conv.get(), algo, ws, bytes, beta, c.x.get(), c.x_data));
  }
};

struct BackwardFilterPass {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr int kId = 2;
  static constexpr int kAlgos = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static constexpr const char* kName = "conv2d backward (weight)";

  static int max_count(const ConvCall& c) {
    int count = 0;
    WEFT_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(c.handle, &count));
    return count;
  }
  static cudnnStatus_t workspace(const ConvCall& c, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(c.handle, c.x.get(), c.y.get(), c.conv.get(), c.w.get(),
                                                          algo, bytes);
  }
  // grad_weight may already hold the sum of earlier chunks: the search writes scratch.
  static void find(const ConvCall& c, Device device, int count, int* returned, Perf* results, void* ws,
                   size_t bytes) {
    Tensor scratch = empty({c.w_bytes}, TensorOptions(DType::UInt8, device));
    WEFT_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(c.handle, c.x.get(), c.x_data, c.y.get(),
                                                                  c.y_data, c.conv.get(), c.w.get(),
                                                                  scratch.raw_data(), count, returned, results, ws,
                                                                  bytes));
  }
  static void run(const ConvCall& c, Algo algo, void* ws, size_t bytes, const void* alpha, const void* beta) {
    WEFT_CUDA_CHECK(cudnnConvolutionBackwardFilter(c.handle, alpha, c.x.get(), c.x_data, c.y.get(), c.y_data,
                                                   c.conv.get(), algo, ws, bytes, beta, c.w.get(), c.w_data));
  }
};

// Everything an algorithm choice depends on: pass, dtype, GPU, TF32 permission, the
// input and weight sizes and the convolution's parameters.
using ConvKey = std::array<int64_t, 19>;

struct Choice {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
};

struct ChoiceCache {
  std::mutex mutex;
  std::map<ConvKey, Choice> choices;
};

ChoiceCache& choice_cache() {
  static ChoiceCache* cache = new ChoiceCache;  // outlives static teardown, like the handles
  return *cache;
}

// The math type the search asks for. For float32 without TF32 only FMA kernels are
// allowed; otherwise cuDNN's default, which includes TF32 for float32 on Ampere and newer.
cudnnMathType_t requested_math(DType dtype) {
  return dtype == DType::Float32 && !allow_tf32() ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

// Whether an algorithm's reported math type keeps weft's precision promise.
bool acceptable_math(cudnnMathType_t math, DType dtype) {
  if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;  // rounds operands to half precision
  return dtype != DType::Float32 || allow_tf32() || math == CUDNN_FMA_MATH;
}

Tensor workspace_tensor(size_t bytes, Device device) {
  if (bytes == 0) return Tensor();
  return empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::UInt8, device));
}

void* data_of(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// The search's workspace. When the device cannot spare it, the search goes on with none
// (only algorithms without workspace compete), and says so once.
Tensor search_workspace(size_t& bytes, Device device) {
  try {
    return workspace_tensor(bytes, device);
  } catch (const Error& e) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      std::cerr << "weft: conv2d: no memory for a " << bytes << "-byte cuDNN search workspace on " << device
                << "; choosing among algorithms that need none (" << e.what() << ")\n";
    bytes = 0;
    return Tensor();
  }
}

// The cached choice for `key`, searching for it on the call's operands the first time.
template <class P>
Choice choose(const ConvCall& c, const ConvKey& key, DType dtype, Device device) {
  ChoiceCache& cache = choice_cache();
  {
    std::lock_guard lock(cache.mutex);
    auto it = cache.choices.find(key);
    if (it != cache.choices.end()) return it->second;
  }
  c.conv.set_math_type(requested_math(dtype));
  size_t bytes = 0;
  for (int a = 0; a < P::kAlgos; ++a) {
    size_t need = 0;
    if (P::workspace(c, static_cast<typename P::Algo>(a), &need) == CUDNN_STATUS_SUCCESS) bytes = std::max(bytes, need);
  }
  bytes = std::min(bytes, kMaxSearchWorkspace);
  Tensor ws = search_workspace(bytes, device);
  const int count = P::max_count(c);
  std::vector<typename P::Perf> results(static_cast<size_t>(count));
  int returned = 0;
  P::find(c, device, count, &returned, results.data(), data_of(ws), bytes);

  // Results come fastest first. The fastest deterministic one wins; when cuDNN has none
  // for this geometry, the fastest one at all, and the downgrade is said once.
  const typename P::Perf* best = nullptr;
  const typename P::Perf* fastest = nullptr;
  for (int i = 0; i < returned && best == nullptr; ++i) {
    const typename P::Perf& r = results[static_cast<size_t>(i)];
    if (r.status != CUDNN_STATUS_SUCCESS || !acceptable_math(r.mathType, dtype)) continue;
    if (fastest == nullptr) fastest = &r;
    if (r.determinism == CUDNN_DETERMINISTIC) best = &r;
  }
  WEFT_CHECK(fastest != nullptr, P::kName, ": cuDNN offers no ",
             dtype == DType::Float32 && !allow_tf32() ? "FMA (non-TF32) " : "", "algorithm for this geometry (",
             dtype_name(dtype), ", input [", key[4], ", ", key[5], ", ", key[6], ", ", key[7], "], weight [", key[8],
             ", ", key[9], ", ", key[10], ", ", key[11], "])");
  if (best == nullptr) {
    best = fastest;
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      std::cerr << "weft: " << P::kName << ": cuDNN has no deterministic algorithm for input [" << key[4] << ", "
                << key[5] << ", " << key[6] << ", " << key[7] << "] (" << dtype_name(dtype)
                << "); using a non-deterministic one (said once)\n";
  }
  // The workspace is asked again under the algorithm's own math type, which is what runs.
  Choice choice{static_cast<int>(best->algo), best->mathType, best->memory};
  c.conv.set_math_type(choice.math);
  size_t need = 0;
  WEFT_CUDA_CHECK(P::workspace(c, best->algo, &need));
  choice.workspace = std::max(choice.workspace, need);

  std::lock_guard lock(cache.mutex);
  return cache.choices.emplace(key, choice).first->second;  // a racing thread's equal choice may have won
}

// Runs pass P with its cached (or newly found) algorithm: output = alpha * result + beta * output.
template <class P, class T>
void run_pass(const ConvCall& c, ConvKey key, DType dtype, Device device, T beta) {
  key[0] = P::kId;
  const Choice choice = choose<P>(c, key, dtype, device);
  c.conv.set_math_type(choice.math);
  Tensor ws = workspace_tensor(choice.workspace, device);
  const T alpha = 1;
  P::run(c, static_cast<typename P::Algo>(choice.algo), data_of(ws), choice.workspace, &alpha, &beta);
}

// Sizes of one convolution call, for descriptors and keys.
struct Geometry {
  int64_t n, channels, height, width, out_channels, out_h, out_w;
  std::array<int64_t, 4> weight;
  int64_t chunk;  // samples per cuDNN call

  Geometry(const Tensor& input, const Tensor& weight_t, const Tensor& out)
      : n(input.size(0)), channels(input.size(1)), height(input.size(2)), width(input.size(3)),
        out_channels(out.size(1)), out_h(out.size(2)), out_w(out.size(3)),
        weight{weight_t.size(0), weight_t.size(1), weight_t.size(2), weight_t.size(3)} {
    const int64_t per_sample = std::max(channels * height * width, out_channels * out_h * out_w);
    WEFT_CHECK(per_sample <= INT_MAX, "conv2d: one sample of input [", n, ", ", channels, ", ", height, ", ", width,
               "] or output [", n, ", ", out_channels, ", ", out_h, ", ", out_w, "] has more than ", INT_MAX,
               " elements, beyond what cuDNN's convolutions address");
    chunk = std::min<int64_t>(n, INT_MAX / per_sample);
  }
  int64_t input_numel(int64_t samples) const { return samples * channels * height * width; }
  int64_t output_numel(int64_t samples) const { return samples * out_channels * out_h * out_w; }

  // The key of a call over `samples` samples; key[0] (the pass) is set by run_pass.
  ConvKey key(int64_t samples, DType dtype, Device device, const Conv2dParams& p) const {
    return {0, static_cast<int64_t>(dtype), physical_device(device), allow_tf32() ? 1 : 0, samples, channels, height,
            width, weight[0], weight[1], weight[2], weight[3], p.stride[0], p.stride[1], p.padding[0], p.padding[1],
            p.dilation[0], p.dilation[1], p.groups};
  }
};

template <class T>
T* offset(const Tensor& t, int64_t elements) {
  return static_cast<T*>(t.raw_data()) + elements;
}

template <class T>
void forward_typed(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                   const Conv2dParams& params) {
  const Device device = out.device();
  const DType dtype = out.dtype();
  DeviceGuard guard(device);
  const Geometry g(input, weight, out);
  cudnnHandle_t handle = cudnn_handle(device);
  const FilterDescriptor w(dtype, g.weight);
  const ConvolutionDescriptor conv(params, dtype);
  const TensorDescriptor bias_desc(dtype, {1, g.out_channels, 1, 1});
  const T one = 1, zero = 0;
  for (int64_t first = 0; first < g.n; first += g.chunk) {
    const int64_t samples = std::min(g.chunk, g.n - first);
    const TensorDescriptor x(dtype, {samples, g.channels, g.height, g.width});
    const TensorDescriptor y(dtype, {samples, g.out_channels, g.out_h, g.out_w});
    T* y_data = offset<T>(out, g.output_numel(first));
    const ConvCall call{handle, x, w, conv, y, offset<T>(input, g.input_numel(first)), weight.raw_data(), y_data,
                        weight.nbytes()};
    run_pass<ForwardPass>(call, g.key(samples, dtype, device, params), dtype, device, zero);
    if (bias.defined())
      WEFT_CUDA_CHECK(cudnnAddTensor(handle, &one, bias_desc.get(), bias.raw_data(), &one, y.get(), y_data));
  }
}

template <class T>
void backward_typed(const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& grad_input,
                    const Tensor& grad_weight, const Tensor& grad_bias, const Conv2dParams& params) {
  const Device device = grad_out.device();
  const DType dtype = grad_out.dtype();
  DeviceGuard guard(device);
  const Geometry g(input, weight, grad_out);
  cudnnHandle_t handle = cudnn_handle(device);
  const FilterDescriptor w(dtype, g.weight);
  const ConvolutionDescriptor conv(params, dtype);
  const TensorDescriptor bias_desc(dtype, {1, g.out_channels, 1, 1});
  const T one = 1, zero = 0;
  for (int64_t first = 0; first < g.n; first += g.chunk) {
    const int64_t samples = std::min(g.chunk, g.n - first);
    const TensorDescriptor x(dtype, {samples, g.channels, g.height, g.width});
    const TensorDescriptor y(dtype, {samples, g.out_channels, g.out_h, g.out_w});
    T* dy = offset<T>(grad_out, g.output_numel(first));
    const ConvKey key = g.key(samples, dtype, device, params);
    // grad_weight and grad_bias sum over samples: later chunks add to the first.
    const T accumulate = first == 0 ? zero : one;
    if (grad_input.defined()) {
      const ConvCall call{handle, x, w, conv, y, offset<T>(grad_input, g.input_numel(first)), weight.raw_data(), dy,
                          weight.nbytes()};
      run_pass<BackwardDataPass>(call, key, dtype, device, zero);
    }
    if (grad_weight.defined()) {
      const ConvCall call{handle, x, w, conv, y, offset<T>(input, g.input_numel(first)), grad_weight.raw_data(), dy,
                          weight.nbytes()};
      run_pass<BackwardFilterPass>(call, key, dtype, device, accumulate);
    }
    if (grad_bias.defined())
      WEFT_CUDA_CHECK(
          cudnnConvolutionBackwardBias(handle, &one, y.get(), dy, &accumulate, bias_desc.get(), grad_bias.raw_data()));
  }
}

void conv2d_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& out,
                    const Conv2dParams& params) {
  dispatch_floating(input.dtype(), "conv2d", [&](auto tag) {
    forward_typed<typename decltype(tag)::type>(input, weight, bias, out, params);
  });
}

void conv2d_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& grad_input,
                     const Tensor& grad_weight, const Tensor& grad_bias, const Conv2dParams& params) {
  dispatch_floating(input.dtype(), "conv2d backward", [&](auto tag) {
    backward_typed<typename decltype(tag)::type>(grad_out, input, weight, grad_input, grad_weight, grad_bias,
                                                  params);
  });
}

}  // namespace

void register_conv_kernels() {
  conv2d_forward_stub.set(DeviceType::CUDA, &conv2d_forward);
  conv2d_backward_stub.set(DeviceType::CUDA, &conv2d_backward);
}

}  // namespace weft::cuda
