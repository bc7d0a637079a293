// CUDA conv2d: cuDNN's convolutions, with the algorithm of each pass chosen once per geometry.
//
// Forward, backward-data and backward-filter each have several cuDNN algorithms whose
// speed depends on the shapes. The first call with a given geometry lists them and keeps
// one by the rules of conv_algorithm.h, with its workspace size; later calls with that
// geometry reuse it, so a training step always runs the same algorithms and gives the same
// bits. By default the list is measured on the call's own operands (cudnnFind*AlgorithmEx,
// with a search workspace from weft's allocator that is given back to the GPU afterwards)
// and the fastest acceptable algorithm wins; with deterministic_algorithms() on, the list
// is cuDNN's heuristic order (cudnnGet*Algorithm_v7), which does not vary between
// processes, so a resumed run picks what the run it continues picked. Acceptable means:
// deterministic (the CPU promises results that do not depend on scheduling, and some
// backward algorithms accumulate with atomics), and, for float32, plain FMA arithmetic
// unless allow_tf32() is on: cuDNN's default math lets Ampere and newer GPUs round float32
// operands to TF32, which weft does not do unasked. Where cuDNN has nothing acceptable,
// weft's own direct kernels (direct_conv.h) run the pass, said once. Bias: cudnnAddTensor
// forward, cudnnConvolutionBackwardBias backward.
//
// cuDNN's legacy API counts elements in int: a batch whose input or output has more than
// INT_MAX elements runs in chunks of samples (grad_weight and grad_bias accumulate
// over the chunks).
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/determinism.h"
#include "core/error.h"
#include "kernels/conv_kernels.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/conv_algorithm.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/direct_conv.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/runtime.h"

namespace weft::cuda {

namespace {

// The search's workspace is what the hungriest algorithm asks for, up to this much: an
// algorithm that needs more is simply not among the candidates (in either mode, so that
// the limit, not the memory free at the time, decides).
constexpr size_t kMaxWorkspace = size_t(1) << 30;

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
  DType dtype;
  Device device;
  DirectConvGeometry geometry;  // the same call for weft's own kernels
};

struct ForwardPass {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr int kId = 0;  // the pass in ConvKey
  static constexpr int kAlgos = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr const char* kName = "conv2d forward";
  static constexpr std::array<const char*, 8> kAlgoNames = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};

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
  static void find(const ConvCall& c, int count, int* returned, Perf* results, void* ws, size_t bytes) {
    WEFT_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithmEx(c.handle, c.x.get(), c.x_data, c.w.get(), c.w_data,
                                                           c.conv.get(), c.y.get(), c.y_data, count, returned,
                                                           results, ws, bytes));
  }
  static void heuristic(const ConvCall& c, int count, int* returned, Perf* results) {
    WEFT_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(c.handle, c.x.get(), c.w.get(), c.conv.get(), c.y.get(),
                                                           count, returned, results));
  }
  static void direct(const ConvCall& c, bool) {
    direct_conv2d_forward(c.dtype, c.x_data, c.w_data, c.y_data, c.geometry, c.device);
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
  static constexpr std::array<const char*, 6> kAlgoNames = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD",
                                                            "WINOGRAD_NONFUSED"};

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
  static void find(const ConvCall& c, int count, int* returned, Perf* results, void* ws, size_t bytes) {
    WEFT_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(c.handle, c.w.get(), c.w_data, c.y.get(), c.y_data,
                                                                c.conv.get(), c.x.get(), c.x_data, count, returned,
                                                                results, ws, bytes));
  }
  static void heuristic(const ConvCall& c, int count, int* returned, Perf* results) {
    WEFT_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(c.handle, c.w.get(), c.y.get(), c.conv.get(),
                                                                c.x.get(), count, returned, results));
  }
  static void direct(const ConvCall& c, bool) {
    direct_conv2d_backward_input(c.dtype, c.y_data, c.w_data, c.x_data, c.geometry, c.device);
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
  static constexpr std::array<const char*, 7> kAlgoNames = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD",
                                                            "WINOGRAD_NONFUSED", "FFT_TILING"};

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
  static void find(const ConvCall& c, int count, int* returned, Perf* results, void* ws, size_t bytes) {
    Tensor scratch = empty({c.w_bytes}, TensorOptions(DType::UInt8, c.device));
    WEFT_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(c.handle, c.x.get(), c.x_data, c.y.get(),
                                                                  c.y_data, c.conv.get(), c.w.get(),
                                                                  scratch.raw_data(), count, returned, results, ws,
                                                                  bytes));
  }
  static void heuristic(const ConvCall& c, int count, int* returned, Perf* results) {
    WEFT_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(c.handle, c.x.get(), c.y.get(), c.conv.get(),
                                                                  c.w.get(), count, returned, results));
  }
  static void direct(const ConvCall& c, bool accumulate) {
    direct_conv2d_backward_weight(c.dtype, c.x_data, c.y_data, c.w_data, accumulate, c.geometry, c.device);
  }
  static void run(const ConvCall& c, Algo algo, void* ws, size_t bytes, const void* alpha, const void* beta) {
    WEFT_CUDA_CHECK(cudnnConvolutionBackwardFilter(c.handle, alpha, c.x.get(), c.x_data, c.y.get(), c.y_data,
                                                   c.conv.get(), algo, ws, bytes, beta, c.w.get(), c.w_data));
  }
};

// Everything an algorithm choice depends on: pass, dtype, GPU, TF32 permission,
// deterministic mode, the input and weight sizes and the convolution's parameters.
using ConvKey = std::array<int64_t, 20>;
constexpr size_t kDeterministicSlot = 4;

struct Choice {
  bool weft_kernel;  // no acceptable cuDNN algorithm: weft's direct kernel runs the pass
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

ConvMath conv_math(cudnnMathType_t math) {
  switch (math) {
    case CUDNN_FMA_MATH: return ConvMath::Fma;
    case CUDNN_TENSOR_OP_MATH: return ConvMath::TensorOp;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return ConvMath::TensorOpAllowConversion;
    default: return ConvMath::Default;
  }
}

cudnnMathType_t cudnn_math(ConvMath math) {
  switch (math) {
    case ConvMath::Fma: return CUDNN_FMA_MATH;
    case ConvMath::TensorOp: return CUDNN_TENSOR_OP_MATH;
    case ConvMath::TensorOpAllowConversion: return CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    case ConvMath::Default: break;
  }
  return CUDNN_DEFAULT_MATH;
}

template <class Perf>
ConvAlgorithmCandidate candidate(const Perf& r) {
  return {static_cast<int>(r.algo), r.status == CUDNN_STATUS_SUCCESS, r.determinism == CUDNN_DETERMINISTIC,
          conv_math(r.mathType), r.time, r.memory};
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

// cuDNN's candidates measured on the call's operands, fastest first.
template <class P>
std::vector<ConvAlgorithmCandidate> timed_candidates(const ConvCall& c) {
  size_t bytes = 0;
  for (int a = 0; a < P::kAlgos; ++a) {
    size_t need = 0;
    if (P::workspace(c, static_cast<typename P::Algo>(a), &need) == CUDNN_STATUS_SUCCESS) bytes = std::max(bytes, need);
  }
  bytes = std::min(bytes, kMaxWorkspace);
  Tensor ws = search_workspace(bytes, c.device);
  std::vector<typename P::Perf> results(static_cast<size_t>(P::max_count(c)));
  int returned = 0;
  P::find(c, static_cast<int>(results.size()), &returned, results.data(), data_of(ws), bytes);
  // The search workspace is as large as the hungriest algorithm's, up to 1 GiB, and is not
  // needed again: give its segment back to the GPU rather than leave it cached.
  void* search_block = data_of(ws);
  ws = Tensor();
  device_allocator(c.device).release_free_segment(search_block);
  std::vector<ConvAlgorithmCandidate> out;
  for (int i = 0; i < returned; ++i) out.push_back(candidate(results[static_cast<size_t>(i)]));
  return out;
}

// cuDNN's candidates in its heuristic order: nothing runs, and the order depends only on
// the GPU, the cuDNN version and the geometry.
template <class P>
std::vector<ConvAlgorithmCandidate> heuristic_candidates(const ConvCall& c) {
  std::vector<typename P::Perf> results(static_cast<size_t>(P::max_count(c)));
  int returned = 0;
  P::heuristic(c, static_cast<int>(results.size()), &returned, results.data());
  std::vector<ConvAlgorithmCandidate> out;
  for (int i = 0; i < returned; ++i) out.push_back(candidate(results[static_cast<size_t>(i)]));
  return out;
}

std::string describe_geometry(const ConvCall& c) {
  const DirectConvGeometry& g = c.geometry;
  const Conv2dParams& p = g.params;
  std::ostringstream out;
  out << dtype_name(c.dtype) << ", input [" << g.n << ", " << g.channels << ", " << g.height << ", " << g.width
      << "], weight [" << g.out_channels << ", " << g.channels / p.groups << ", " << g.kh << ", " << g.kw
      << "], stride (" << p.stride[0] << ", " << p.stride[1] << "), padding (" << p.padding[0] << ", "
      << p.padding[1] << "), dilation (" << p.dilation[0] << ", " << p.dilation[1] << "), groups " << p.groups;
  return out.str();
}

const char* math_name(cudnnMathType_t math) {
  switch (math) {
    case CUDNN_FMA_MATH: return "FMA math";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op math with conversion";
    default: return "default math";
  }
}

// WEFT_CONV_LOG=1: one line per choice on stderr, to see what a model's convolutions run.
template <class P>
void log_choice(const ConvCall& c, const Choice& choice, const ConvAlgorithmChoice& chosen, bool deterministic) {
  static const bool enabled = [] {
    const char* v = std::getenv("WEFT_CONV_LOG");
    return v && std::string(v) == "1";
  }();
  static_assert(P::kAlgoNames.size() == static_cast<size_t>(P::kAlgos),
                "a name for each of cuDNN's algorithms of the pass");
  if (!enabled) return;
  std::ostringstream out;
  out << "weft: " << P::kName << ": " << describe_geometry(c) << ": ";
  if (choice.weft_kernel) {
    out << "weft's direct kernel, no cuDNN algorithm being acceptable";
  } else {
    const auto index = static_cast<size_t>(choice.algo);
    out << "cuDNN's " << (index < P::kAlgoNames.size() ? P::kAlgoNames[index] : "algorithm") << " (" << choice.algo
        << ", " << math_name(choice.math) << ", " << choice.workspace << " bytes of workspace";
    if (chosen.algorithm.time_ms >= 0) out << ", " << chosen.algorithm.time_ms << " ms when timed";
    out << ")" << (deterministic ? ", the first acceptable in cuDNN's heuristic order" : ", the fastest acceptable");
  }
  if (!chosen.rejected.empty()) out << "; rejected: " << chosen.rejected;
  std::cerr << out.str() << "\n";
}

// The cached choice for `key`, made from cuDNN's candidates the first time.
template <class P>
Choice choose(const ConvCall& c, const ConvKey& key, bool deterministic) {
  ChoiceCache& cache = choice_cache();
  {
    std::lock_guard lock(cache.mutex);
    auto it = cache.choices.find(key);
    if (it != cache.choices.end()) return it->second;
  }
  c.conv.set_math_type(requested_math(c.dtype));
  const ConvAlgorithmRules rules{deterministic, c.dtype == DType::Float32 && !allow_tf32(), kMaxWorkspace};
  const ConvAlgorithmChoice chosen =
      choose_conv_algorithm(deterministic ? heuristic_candidates<P>(c) : timed_candidates<P>(c), rules);

  Choice choice{true, 0, CUDNN_DEFAULT_MATH, 0};
  if (chosen.source == ConvAlgorithmSource::WeftKernel) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      std::cerr << "weft: " << P::kName << ": cuDNN has no acceptable " << (deterministic ? "deterministic " : "")
                << "algorithm for " << describe_geometry(c) << " (" << chosen.rejected
                << "); weft's direct convolution kernel runs it instead (slower; said once)\n";
  } else {
    if (chosen.source == ConvAlgorithmSource::CudnnNonDeterministic) {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true))
        std::cerr << "weft: " << P::kName << ": cuDNN has no deterministic algorithm for " << describe_geometry(c)
                  << " (" << chosen.rejected << "); using a non-deterministic one, whose results may vary from "
                  << "run to run (WEFT_DETERMINISTIC=1 runs weft's own kernel instead; said once)\n";
    }
    // The workspace is asked again under the algorithm's own math type, which is what runs.
    const auto algo = static_cast<typename P::Algo>(chosen.algorithm.algo);
    choice = Choice{false, chosen.algorithm.algo, cudnn_math(chosen.algorithm.math), chosen.algorithm.workspace};
    c.conv.set_math_type(choice.math);
    size_t need = 0;
    const cudnnStatus_t status = P::workspace(c, algo, &need);
    if (status == CUDNN_STATUS_SUCCESS) {
      choice.workspace = std::max(choice.workspace, need);
    } else {
      // cuDNN listed the algorithm but will not size it under its math type: weft's kernel
      // rather than an error, as PyTorch moves on to the next algorithm.
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true))
        std::cerr << "weft: " << P::kName << ": cuDNN refused the workspace query of algorithm " << choice.algo
                  << " for " << describe_geometry(c) << " (" << cudnnGetErrorString(status)
                  << "); weft's direct convolution kernel runs it instead (slower; said once)\n";
      choice = Choice{true, 0, CUDNN_DEFAULT_MATH, 0};
    }
  }
  log_choice<P>(c, choice, chosen, deterministic);
  std::lock_guard lock(cache.mutex);
  return cache.choices.emplace(key, choice).first->second;  // a racing thread's equal choice may have won
}

// Runs pass P with its cached (or newly made) choice: output = alpha * result + beta * output,
// where beta is 0 or 1.
template <class P, class T>
void run_pass(const ConvCall& c, ConvKey key, T beta) {
  key[0] = P::kId;
  const Choice choice = choose<P>(c, key, key[kDeterministicSlot] != 0);
  if (choice.weft_kernel) {
    P::direct(c, beta != T(0));
    return;
  }
  c.conv.set_math_type(choice.math);
  Tensor ws = workspace_tensor(choice.workspace, c.device);
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
    return {0, static_cast<int64_t>(dtype), physical_device(device), allow_tf32() ? 1 : 0,
            deterministic_algorithms() ? 1 : 0, samples, channels, height, width, weight[0], weight[1], weight[2],
            weight[3], p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0], p.dilation[1], p.groups};
  }
  // The same call for weft's direct kernels.
  DirectConvGeometry direct(int64_t samples, const Conv2dParams& p) const {
    return {samples, channels, height, width, out_channels, out_h, out_w, weight[2], weight[3], p};
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
                        weight.nbytes(), dtype, device, g.direct(samples, params)};
    run_pass<ForwardPass>(call, g.key(samples, dtype, device, params), zero);
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
                          weight.nbytes(), dtype, device, g.direct(samples, params)};
      run_pass<BackwardDataPass>(call, key, zero);
    }
    if (grad_weight.defined()) {
      const ConvCall call{handle, x, w, conv, y, offset<T>(input, g.input_numel(first)), grad_weight.raw_data(), dy,
                          weight.nbytes(), dtype, device, g.direct(samples, params)};
      run_pass<BackwardFilterPass>(call, key, accumulate);
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
