// Device-side errors on a GPU (Note [Device-side errors], kernels/cuda/device_error_record.h):
// a bad index or class target is recorded by the op's kernel, the host does not wait for
// it, and the next synchronisation raises a weft::Error naming the op and the bad value;
// the GPU stays usable. Also WEFT_CUDA_SYNC_LAUNCHES=1, which raises it at the op itself.
// The messages themselves are tested without a GPU in test_launch_diagnostics.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/check.h"

using namespace weft;
using namespace weft::test;
using doctest::Contains;

namespace {

Tensor indices(const std::vector<int64_t>& values, const Shape& shape) { return on_gpu(tensor(values, shape)); }

// Sync-launch mode for one case (WEFT_CUDA_SYNC_LAUNCHES=1 does this for a whole process),
// off again at the end whatever happens, so the other cases see their errors deferred.
struct SyncLaunches {
  SyncLaunches() { cuda::set_sync_launches(true); }
  ~SyncLaunches() { cuda::set_sync_launches(false); }
};

}  // namespace

TEST_CASE("WEFT_CUDA_SYNC_LAUNCHES=1 raises a device-side error at the op that recorded it") {
  SyncLaunches sync_launches;
  Tensor x = on_gpu(random({5, 3}, DType::Float32, 1));
  CHECK_THROWS_WITH_AS(gather(x, 1, indices({0, 1, 2, 3}, {4, 1})),
                       Contains("gather: index 3 at flat position 3 is out of range (expected 0 <= index < 3)"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, indices({0, 1, 2, 7, 0}, {5})),
                       Contains("cross_entropy: target value 7 at flat position 3"), Error);
  // Launches that are fine still run (each followed by a synchronisation).
  CHECK(sum(x).item() == doctest::Approx(sum(x.to(kCPU)).item()).epsilon(1e-6));
}

TEST_CASE("a bad index is raised at the next synchronisation, naming the op; the GPU stays usable") {
  Tensor x = on_gpu(random({6, 4}, DType::Float64, 2));
  const Tensor x_cpu = x.to(kCPU);

  // Each kind of synchronisation raises it: item(), a copy to the host, a stream and a
  // device synchronize.
  Tensor gathered = gather(x, 1, indices({0, 4, 1, 2, 3, 0}, {6, 1}));
  CHECK_THROWS_WITH_AS(sum(gathered).item(), Contains("gather: index 4 at flat position 1"), Error);
  Tensor selected = index_select(x, 0, indices({5, 6}, {2}));
  CHECK_THROWS_WITH_AS(selected.to(kCPU), Contains("index_select: index 6 at flat position 1"), Error);
  Tensor looked_up = embedding(x, indices({-1, 2}, {1, 2}));
  CHECK_THROWS_WITH_AS(current_stream(gpu()).synchronize(), Contains("embedding: index -1 at flat position 0"),
                       Error);
  Tensor added = scatter_add(x, 0, indices({0, 9, 1, 2}, {1, 4}), on_gpu(ones({1, 4}, DType::Float64)));
  CHECK_THROWS_WITH_AS(synchronize(gpu()), Contains("scatter_add: index 9 at flat position 1"), Error);
  // A bad entry was skipped, never followed: the rest of the op's output is right.
  Tensor expected = x_cpu.clone();
  for (int64_t col : {0, 2, 3}) {
    const int64_t row = std::vector<int64_t>{0, 9, 1, 2}[static_cast<size_t>(col)];
    add_(expected.select(0, row).select(0, col), 1.0);
  }
  CHECK_IDENTICAL(added, expected);

  // Raised once, then cleared: the same tensors read fine, and new ops run.
  CHECK(selected.to(kCPU).select(0, 1).to_vector<double>() == std::vector<double>(4, 0.0));
  CHECK_IDENTICAL(index_select(x, 0, indices({5, 0}, {2})), index_select(x_cpu, 0, tensor(std::vector<int64_t>{5, 0})));
  synchronize(gpu());
}

TEST_CASE("a bad class target is raised at the next synchronisation, naming the loss") {
  Tensor logits = on_gpu(random({4, 5}, DType::Float32, 3), true);
  Tensor loss = cross_entropy(logits, indices({0, 1, 5, 2}, {4}));
  CHECK_THROWS_WITH_AS(loss.item(),
                       Contains("cross_entropy: target value 5 at flat position 2 is out of range for 5 classes "
                                "(expected 0 .. 4, or ignore_index -100)"),
                       Error);
  loss.backward();  // the bad position's loss was 0, and so is its gradient
  CHECK(logits.grad().to(kCPU).select(0, 2).to_vector<float>() == std::vector<float>(5, 0.0f));
  Tensor nll = nll_loss(log_softmax(logits.detach(), 1), indices({-3, 1, 2, 3}, {4}), Reduction::Sum);
  CHECK_THROWS_WITH_AS(nll.item(), Contains("nll_loss: target value -3 at flat position 0"), Error);
  CHECK(std::isfinite(cross_entropy(logits.detach(), indices({0, 1, 4, 2}, {4})).item()));
}

TEST_CASE("the first device-side error is kept until it is raised; later ones are dropped") {
  Tensor x = on_gpu(random({3, 3}, DType::Float32, 4));
  Tensor first = gather(x, 0, indices({7, 0, 0}, {1, 3}));
  Tensor second = cross_entropy(x, indices({0, 9, 1}, {3}));
  CHECK_THROWS_WITH_AS(second.item(), Contains("gather: index 7"), Error);
  second.item();  // the loss's own error was dropped: nothing is pending any more
  CHECK(first.to(kCPU).select(1, 0).to_vector<float>() == std::vector<float>{0.0f});
}

TEST_CASE("clip_grad_norm_ on CUDA leaves the norm on the GPU and needs no synchronisation") {
  Tensor p = on_gpu(random({1000}, DType::Float32, 5), true);
  p.set_grad(on_gpu(random({1000}, DType::Float32, 6)));
  const double expected = std::sqrt(sum(pow(p.grad().to(kCPU).to(DType::Float64), 2.0)).item());
  Tensor norm = optim::clip_grad_norm_({p}, 0.5 * expected);
  CHECK(norm.device() == gpu());
  CHECK(norm.dim() == 0);
  CHECK(norm.item() == doctest::Approx(expected).epsilon(1e-12));
  const double after = std::sqrt(sum(pow(p.grad().to(kCPU).to(DType::Float64), 2.0)).item());
  CHECK(after == doctest::Approx(0.5 * expected).epsilon(1e-5));
}
