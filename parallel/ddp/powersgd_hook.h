// PowerSGD: DDP's gradients sent as low-rank factors (Vogels et al., NeurIPS 2019; PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
//
//   auto state = std::make_shared<parallel::PowerSGDState>(parallel::PowerSGDOptions{.rank = 2});
//   ddp->register_comm_hook(parallel::powersgd_hook(state));
//
// Each gradient of two or more dimensions, viewed as an n x m matrix M (its first dimension
// by the rest), is replaced by the rank-r product P Q^T of one step of power iteration:
//   P = M Q            (Q: m x r, the last step's, or random)   all-reduced (summed)
//   P = orthonormal columns (Gram-Schmidt)
//   Q = M^T P          all-reduced, divided by the ranks
//   M <- P Q^T         = P P^T avg(M): the average projected on r directions
// so (n + m) r numbers cross the wire instead of n m. Gradients for which that is not more
// than min_compression_rate times fewer (biases, small layers) are all-reduced as they are.
// Error feedback adds what the last approximation left out (each rank's input minus the
// output) to the next gradient, so nothing is lost for good; warm start begins each power
// iteration from the last Q. Until start_iteration, buckets are all-reduced exactly.
//
// Where weft differs from PyTorch: a column that Gram-Schmidt finds to be zero (a gradient
// that is zero in the directions left) becomes zero instead of NaN (with warm start, it then
// stays zero). The P and Q all-reduces
// of a bucket run when the reducer waits for it, in bucket order, after backward (PyTorch
// chains them as futures); the exact all-reduce of its small gradients starts at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "core/generator.h"
#include "parallel/ddp/comm_hooks.h"

namespace weft::parallel {

struct PowerSGDOptions {
  int64_t rank = 1;                   // PyTorch's matrix_approximation_rank
  int64_t start_iteration = 1000;     // PyTorch's start_powerSGD_iter: exact all-reduces before it
  double min_compression_rate = 2;    // compress M only if n m > rate * (n + m) r
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;  // added to each column's norm before dividing
  uint64_t seed = 0;                  // of the random Q, the same on every rank
};

// What the hook keeps between iterations (every rank holds its own, made alike).
class PowerSGDState {
 public:
  // Checks the options: rank >= 1; with error feedback or warm start, start_iteration >= 2
  // (DDP rebuilds its buckets after the first iteration, and the state is kept per bucket).
  explicit PowerSGDState(PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  int64_t iteration() const { return iteration_; }  // backward passes seen
  // Since start_iteration: the elements of every gradient the hook exchanged, and the
  // elements it sent for them (factors for the compressed ones); their ratio is the
  // compression rate (PyTorch's total_numel_before / after_compression).
  int64_t elements_before() const { return elements_before_; }
  int64_t elements_after() const { return elements_after_; }

 private:
  friend class PowerSGDBucketRun;
  PowerSGDOptions options_;
  int64_t iteration_ = 0;
  int64_t elements_before_ = 0, elements_after_ = 0;
  Generator rng_;
  std::map<size_t, Tensor> error_;              // per bucket index: input - output of the last step
  std::map<size_t, Tensor> p_memory_, q_memory_;  // per bucket index: the factors, flat
};

CommHook powersgd_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace weft::parallel
