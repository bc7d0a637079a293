// Determinism under threads: per-device generators, fork_join carrying the thread state
// (grad mode, current streams, autograd numbering, a CPU thread share), and forward +
// backward on four threads at once, each on its own cpu:i, bit-identical to the same work
// done one device after the other. These are also the suites to run under
// ThreadSanitizer (-fsanitize=thread): the allocator, the generator registry and the
// backward engine are used from several threads at once.
#include "test_util.h"

#include <atomic>
#include <stdexcept>

#include "core/stream.h"
#include "core/thread_state.h"
#include "parallel/local/fork_join.h"

using namespace weft;
using doctest::Contains;

namespace {

// Runs `body(i)` for i in [0, n): on n threads at once, or one after the other.
template <class F>
void for_each_device(int n, bool threaded, const F& body) {
  if (!threaded) {
    for (int i = 0; i < n; ++i) body(i);
    return;
  }
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < n; ++i) tasks.push_back([&body, i] { body(i); });
  for (const std::exception_ptr& error : parallel::fork_join(tasks))
    if (error) std::rethrow_exception(error);
}

}  // namespace

TEST_CASE("every device has its own default generator, seeded from manual_seed") {
  manual_seed(77);
  CHECK(default_generator().seed() == 77);
  CHECK(&default_generator() == &default_generator(kCPU));
  CHECK(default_generator(Device::cuda(0)).seed() == 77);  // index 0: the seed itself, on every device type
  const uint64_t s1 = default_generator(Device("cpu:1")).seed();
  CHECK(s1 == device_seed(77, Device("cpu:1")));
  CHECK(s1 != 77);
  CHECK(s1 != default_generator(Device("cpu:2")).seed());
  CHECK(default_generator(Device::cuda(1)).seed() == s1);  // cuda:i draws what cpu:i draws
  manual_seed(78);  // reseeds generators made before
  CHECK(default_generator(Device("cpu:1")).seed() == device_seed(78, Device("cpu:1")));
  CHECK(default_generator(Device("cpu:1")).offset() == 0);

  // What one device draws does not depend on what another drew first.
  auto masks = [](bool cpu0_first) {
    manual_seed(5);
    Tensor x0 = ones({64}), x1 = ones({64}, TensorOptions(DType::Float32, Device("cpu:1")));
    Tensor m0, m1;
    if (cpu0_first) {
      m0 = dropout(x0, 0.5), m1 = dropout(x1, 0.5);
    } else {
      m1 = dropout(x1, 0.5), m0 = dropout(x0, 0.5);
    }
    return std::make_pair(m0, m1);
  };
  auto [a0, a1] = masks(true);
  auto [b0, b1] = masks(false);
  CHECK_CLOSE(a0, b0, 0, 0);
  CHECK_CLOSE(a1, b1.to(Device("cpu:1")), 0, 0);
  CHECK(test::mismatch(a0, a1.to(kCPU), 0, 0) != "");  // and the two devices draw different masks
}

TEST_CASE("fork_join: tasks inherit grad mode, current streams and a share of the CPU threads") {
  const Device d("cpu:1");
  Stream side = new_stream(d);
  const int parent_threads = num_threads();
  std::vector<int> grad_mode(3, -1), threads(3, 0);
  std::vector<Stream> streams(3, default_stream(d));
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < 3; ++i)
    tasks.push_back([&, i] {
      grad_mode[i] = GradMode::is_enabled();
      streams[i] = current_stream(d);
      threads[i] = num_threads();
    });
  {
    NoGradGuard no_grad;
    StreamGuard on_side(side);
    auto errors = parallel::fork_join(tasks);
    for (auto& e : errors) CHECK_FALSE(e);
  }
  for (int i = 0; i < 3; ++i) {
    CHECK(grad_mode[i] == 0);
    CHECK(streams[i] == side);
    CHECK(threads[i] == std::max(1, parent_threads / 3));
  }
  CHECK(GradMode::is_enabled());
  CHECK(num_threads() == parent_threads);
}

TEST_CASE("fork_join: an exception stays in its task's slot; the others finish") {
  std::atomic<int> finished{0};
  std::vector<std::function<void()>> tasks = {
      [&] { ++finished; }, [] { throw std::runtime_error("task 1 failed"); }, [&] { ++finished; }};
  auto errors = parallel::fork_join(tasks);
  REQUIRE(errors.size() == 3);
  CHECK(finished == 2);
  CHECK_FALSE(errors[0]);
  CHECK_FALSE(errors[2]);
  REQUIRE(errors[1]);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(errors[1]), "task 1 failed", std::runtime_error);
  CHECK(parallel::fork_join({}).empty());
}

TEST_CASE("fork_join: the caller's next nodes are numbered after every node its tasks made") {
  Tensor w = ones({3}).requires_grad_();
  Tensor before = mul(w, 2.0);
  const uint64_t start = before.grad_fn()->sequence_nr();
  std::vector<Tensor> made(2);
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < 2; ++i)
    tasks.push_back([&, i] {
      Tensor t = w;
      for (int k = 0; k < 5 * (i + 1); ++k) t = mul(t, 1.0);  // task 1 makes more nodes than task 0
      made[i] = t;
    });
  parallel::fork_join(tasks);
  CHECK(made[0].grad_fn()->sequence_nr() > start);  // tasks continue the caller's numbering
  CHECK(made[0].grad_fn()->sequence_nr() == start + 5);
  CHECK(made[1].grad_fn()->sequence_nr() == start + 10);
  Tensor after = add(made[0], made[1]);
  CHECK(after.grad_fn()->sequence_nr() > made[1].grad_fn()->sequence_nr());
  sum(after).backward();
  CHECK_CLOSE(w.grad(), full({3}, 2.0), 0, 0);
}

TEST_CASE("forward and backward on four threads, each on its own cpu:i, equal the serial run bit for bit") {
  // ConvNet-like and MLP models with dropout: random draws come from each device's
  // generator, so the threads' interleaving cannot change them.
  constexpr int kDevices = 4;
  Generator init(11);
  nn::MLP mlp(48, {32, 16}, 5, /*dropout=*/0.25, &init);
  auto run = [&](bool threaded) {
    manual_seed(123);
    std::vector<std::vector<Tensor>> grads(kDevices);
    std::vector<Tensor> outputs(kDevices);
    for_each_device(kDevices, threaded, [&](int i) {
      const Device d(DeviceType::CPU, i);
      std::shared_ptr<nn::Module> model = mlp.clone(d);
      Tensor x = test::random({9, 48}, DType::Float32, 200 + i).to(d);
      Tensor y = randint(0, 5, {9}, TensorOptions(DType::Int64, d));
      Tensor out = model->forward(x);
      cross_entropy(out, y).backward();
      outputs[i] = out.detach();
      for (const Tensor& p : model->parameters()) grads[i].push_back(p.grad());
    });
    return std::make_pair(outputs, grads);
  };
  auto [serial_out, serial_grads] = run(false);
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto [out, grads] = run(true);
    for (int i = 0; i < kDevices; ++i) {
      CAPTURE(i);
      CHECK(out[i].device() == Device(DeviceType::CPU, i));
      CHECK_CLOSE(out[i], serial_out[i], 0, 0);
      REQUIRE(grads[i].size() == serial_grads[i].size());
      for (size_t k = 0; k < grads[i].size(); ++k) CHECK_CLOSE(grads[i][k], serial_grads[i][k], 0, 0);
    }
  }
}

TEST_CASE("backward passes on several threads accumulate into one shared leaf") {
  // Integer-valued gradients, so that the sum is exact in any order.
  Tensor w = tensor({1.0f, 2.0f, 3.0f, 4.0f}).requires_grad_();
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < 8; ++i)
    tasks.push_back([&, i] {
      Tensor local = w.to(Device(DeviceType::CPU, i % 4));
      sum(mul(local, static_cast<double>(i + 1))).backward();
    });
  for (auto& e : parallel::fork_join(tasks)) CHECK_FALSE(e);
  CHECK_CLOSE(w.grad(), full({4}, 36.0), 0, 0);  // 1 + 2 + ... + 8
}
