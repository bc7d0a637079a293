// The rules that choose a cuDNN convolution algorithm (see conv_algorithm.h). Plain C++:
// no CUDA here.
#include "kernels/cuda/conv_algorithm.h"

#include <algorithm>
#include <sstream>

#include "kernels/cuda/device_allocator.h"

namespace weft::cuda {

namespace {

enum class Verdict { Acceptable, NotRun, Math, Workspace, NonDeterministic };

// The first rule that `c` breaks, determinism last: the timed mode may still fall back to
// a candidate that breaks only that one.
Verdict judge(const ConvAlgorithmCandidate& c, const ConvAlgorithmRules& rules) {
  if (!c.succeeded) return Verdict::NotRun;
  // ALLOW_CONVERSION rounds float32 operands to half precision: never what weft promises.
  if (c.math == ConvMath::TensorOpAllowConversion) return Verdict::Math;
  if (rules.fma_only && c.math != ConvMath::Fma) return Verdict::Math;
  if (c.workspace > rules.max_workspace) return Verdict::Workspace;
  if (!c.deterministic) return Verdict::NonDeterministic;
  return Verdict::Acceptable;
}

}  // namespace

ConvAlgorithmChoice choose_conv_algorithm(std::vector<ConvAlgorithmCandidate> candidates,
                                          const ConvAlgorithmRules& rules) {
  if (!rules.deterministic) {
    // Fastest first; a candidate without a time (cuDNN did not run it) after every timed one.
    std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      const bool a_timed = a.time_ms >= 0, b_timed = b.time_ms >= 0;
      if (a_timed != b_timed) return a_timed;
      return a_timed && a.time_ms < b.time_ms;
    });
  }
  const ConvAlgorithmCandidate* fallback = nullptr;
  for (const ConvAlgorithmCandidate& c : candidates) {
    const Verdict v = judge(c, rules);
    if (v == Verdict::Acceptable) return {ConvAlgorithmSource::Cudnn, c, ""};
    if (v == Verdict::NonDeterministic && fallback == nullptr) fallback = &c;
  }
  ConvAlgorithmChoice choice;
  choice.rejected = describe_rejections(candidates, rules);
  if (fallback != nullptr && !rules.deterministic) {
    choice.source = ConvAlgorithmSource::CudnnNonDeterministic;
    choice.algorithm = *fallback;
  }
  return choice;
}

std::string describe_rejections(const std::vector<ConvAlgorithmCandidate>& candidates,
                                const ConvAlgorithmRules& rules) {
  int not_run = 0, math = 0, workspace = 0, non_deterministic = 0;
  for (const ConvAlgorithmCandidate& c : candidates) {
    switch (judge(c, rules)) {
      case Verdict::NotRun: ++not_run; break;
      case Verdict::Math: ++math; break;
      case Verdict::Workspace: ++workspace; break;
      case Verdict::NonDeterministic: ++non_deterministic; break;
      case Verdict::Acceptable: break;
    }
  }
  std::ostringstream out;
  out << "of " << candidates.size() << " candidate" << (candidates.size() == 1 ? "" : "s");
  const char* separator = ": ";
  auto part = [&](int count, const std::string& what) {
    if (count == 0) return;
    out << separator << count << " " << what;
    separator = ", ";
  };
  part(not_run, "not supported or failed in cuDNN");
  part(math, rules.fma_only ? "with TF32 or half-precision math (float32 without allow_tf32 asks for FMA)"
                            : "with half-precision math");
  part(workspace, "needing more than " + format_bytes(static_cast<int64_t>(rules.max_workspace)) + " of workspace");
  part(non_deterministic, "not deterministic");
  return out.str();
}

}  // namespace weft::cuda
