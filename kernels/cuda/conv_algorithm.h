// The choice of a cuDNN convolution algorithm, as a pure function over cuDNN's candidates.
//
// For each pass (forward, backward-data, backward-filter) and geometry, cuDNN lists
// candidate algorithms: measured on the call's operands, fastest first (cudnnFind*Ex), or
// in its heuristic order without running anything (cudnnGet*_v7). weft keeps the first
// acceptable one in an order that depends on the mode:
//
// - Timed (the default): candidates by measured time. Acceptable: cuDNN ran it, its math
//   keeps weft's precision promise (no operands rounded to half precision; for float32
//   without allow_tf32(), plain FMA arithmetic, not TF32 tensor cores), its workspace is
//   within the limit, and it is deterministic. Where no deterministic one is acceptable,
//   the fastest non-deterministic one (a downgrade, logged once by the caller).
// - Deterministic (deterministic_algorithms(), core/determinism.h): cuDNN's heuristic
//   order, which depends only on the GPU, the cuDNN version and the geometry, so every
//   process picks the same algorithm and gets the same bits; timings, which vary from run
//   to run, play no part. Only deterministic algorithms are acceptable.
//
// Where nothing is acceptable, weft's own direct-convolution kernel runs the pass
// (kernels/cuda/direct_conv.h): slower, but deterministic and exact to the usual rounding.
// The cuDNN calls that produce the candidates stay in conv.cpp; this file is plain C++ so
// that the rules are tested in CPU CI on made-up candidate lists.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace weft::cuda {

// cuDNN's cudnnMathType_t, without its header.
enum class ConvMath { Default, Fma, TensorOp, TensorOpAllowConversion };

struct ConvAlgorithmCandidate {
  int algo = 0;                // cuDNN's enum value for the pass
  bool succeeded = true;       // cuDNN's status for it was CUDNN_STATUS_SUCCESS
  bool deterministic = false;  // CUDNN_DETERMINISTIC
  ConvMath math = ConvMath::Default;
  float time_ms = -1.0f;       // measured by cudnnFind*; heuristic candidates have none (< 0)
  size_t workspace = 0;        // bytes it needs
};

struct ConvAlgorithmRules {
  bool deterministic = false;  // heuristic order, deterministic algorithms only
  bool fma_only = false;       // float32 without TF32: plain FMA arithmetic only
  size_t max_workspace = 0;    // bytes; candidates that need more are out
};

enum class ConvAlgorithmSource {
  Cudnn,                  // `algorithm`, which meets every rule
  CudnnNonDeterministic,  // `algorithm`, the timed mode's downgrade: no deterministic one was acceptable
  WeftKernel,             // no cuDNN candidate was acceptable: weft's direct convolution
};

struct ConvAlgorithmChoice {
  ConvAlgorithmSource source = ConvAlgorithmSource::WeftKernel;
  ConvAlgorithmCandidate algorithm;  // the candidate chosen (Cudnn and CudnnNonDeterministic)
  std::string rejected;              // what was wrong with the candidates, for the downgrade's log line
};

ConvAlgorithmChoice choose_conv_algorithm(std::vector<ConvAlgorithmCandidate> candidates,
                                          const ConvAlgorithmRules& rules);

// E.g. "of 7 candidates: 2 not run by cuDNN, 1 with TF32 or half-precision math, 4 not
// deterministic"; each candidate counted under the first rule it breaks.
std::string describe_rejections(const std::vector<ConvAlgorithmCandidate>& candidates,
                                const ConvAlgorithmRules& rules);

}  // namespace weft::cuda
