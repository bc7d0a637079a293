// ProcessGroupGloo: weft's collectives on Gloo's algorithms and TCP transport.
#include "parallel/process_group/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <type_traits>

#include "core/autograd.h"
#include "core/error.h"
#include "core/stream.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "kernels/host_device_math.h"
#include "kernels/shape_ops.h"
#include "parallel/process_group/collective_support.h"
#include "parallel/process_group/work_queue.h"

namespace weft::parallel {

bool gloo_available() { return true; }

namespace {

using detail::check_list;
using detail::check_reduce;
using detail::Staged;
using detail::unflatten_into;

// Gloo's rendezvous sees weft's store through this.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<parallel::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = store_->get(key);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<parallel::Store> store_;
};

// Calls f(T{}) with the C++ type Gloo computes `dtype` in.
template <class F>
void with_type(DType dtype, const std::string& what, F&& f) {
  switch (dtype) {
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BFloat16{});
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Int64: return f(int64_t{});
    case DType::Int32: return f(int32_t{});
    case DType::UInt8:
    case DType::Bool: return f(uint8_t{});
    default: WEFT_FAIL(what, ": dtype ", dtype, " is not supported by the Gloo backend");
  }
}

// Note [Reducing 16-bit floats]: Gloo's loops for weft's Half and BFloat16. Each result is
// the float32 result rounded once, which is the correctly rounded 16-bit result (a float's
// 24 bits hold the sum or product of two 16-bit values closely enough: 24 >= 2 * 11 + 2),
// and so the bits that the ring all-reduce's float32 arithmetic gives too. Max and min let
// a NaN through, as weft's maximum and minimum do.
struct Plus {
  static float apply(float a, float b) { return a + b; }
};
struct Times {
  static float apply(float a, float b) { return a * b; }
};
struct Larger {
  static float apply(float a, float b) { return a != a || a > b ? a : b; }
};
struct Smaller {
  static float apply(float a, float b) { return a != a || a < b ? a : b; }
};

template <class H, class Op>
void combine_16bit(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<H*>(c);
  const auto *x = static_cast<const H*>(a), *y = static_cast<const H*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = hd::convert<H>(Op::apply(to_float(x[i]), to_float(y[i])));
}

template <class T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return &combine_16bit<T, Plus>;
      case ReduceOp::Product: return &combine_16bit<T, Times>;
      case ReduceOp::Max: return &combine_16bit<T, Larger>;
      case ReduceOp::Min: return &combine_16bit<T, Smaller>;
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return static_cast<Fn>(&gloo::sum<T>);
      case ReduceOp::Product: return static_cast<Fn>(&gloo::product<T>);
      case ReduceOp::Max: return static_cast<Fn>(&gloo::max<T>);
      case ReduceOp::Min: return static_cast<Fn>(&gloo::min<T>);
    }
  }
  return nullptr;
}

class ProcessGroupGloo final : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout,
                   const std::string& bind_host)
      : ProcessGroup(rank, size, timeout) {
    WEFT_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroupGloo: rank ", rank, " of a group of ", size);
    gloo::transport::tcp::attr attr;
    attr.hostname = bind_host;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(timeout);
      GlooStore gloo_store(std::move(store));
      context->connectFullMesh(gloo_store, device_);
      context_ = std::move(context);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      WEFT_FAIL("ProcessGroupGloo: rank ", rank, " of ", size, " could not connect to the others (listening on ",
                bind_host, "): ", e.what());
    }
    lane_ = new_stream(kCPU);
    trace::name_lane(lane_, "gloo (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")");
    queue_ = std::make_unique<WorkQueue>(timeout);
  }

  std::string backend_name() const override { return "gloo"; }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op) override {
    const std::string what = describe("all_reduce");
    check_cpu(tensor, what);
    check_reduce(tensor.dtype(), op, what);
    return enqueue("all_reduce", what, [this, tensor, op, what](uint32_t tag) {
      Staged io(tensor);
      with_type(tensor.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(io.ptr<T>(), io.count());  // in place: Gloo reads the output when no input is set
        opts.setReduceFunction(reduce_function<T>(op));
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::allreduce(opts);
      });
      if (op == ReduceOp::Avg) detail::divide_in_place(io.tensor(), static_cast<double>(size()));
      io.finish();
    });
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override {
    const std::string what = describe("broadcast");
    check_cpu(tensor, what);
    detail::check_rank(root, size(), "root", what);
    return enqueue("broadcast", what, [this, tensor, root, what](uint32_t tag) {
      Staged io(tensor);
      with_type(tensor.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(io.ptr<T>(), io.count());
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::broadcast(opts);
      });
      io.finish();
    });
  }

  std::shared_ptr<Work> reduce(const Tensor& tensor, int root, ReduceOp op) override {
    const std::string what = describe("reduce");
    check_cpu(tensor, what);
    detail::check_rank(root, size(), "root", what);
    check_reduce(tensor.dtype(), op, what);
    return enqueue("reduce", what, [this, tensor, root, op, what](uint32_t tag) {
      // Gloo uses the output as scratch on every rank: only the root's is the caller's.
      Staged io(tensor);
      Tensor scratch = rank() == root ? io.tensor() : io.tensor().clone();
      with_type(tensor.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::ReduceOptions opts(context_);
        opts.setInput(io.ptr<T>(), io.count());
        opts.setOutput(static_cast<T*>(scratch.raw_data()), io.count());
        opts.setRoot(root);
        opts.setReduceFunction(reduce_function<T>(op));
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::reduce(opts);
      });
      if (rank() == root) {
        if (op == ReduceOp::Avg) detail::divide_in_place(io.tensor(), static_cast<double>(size()));
        io.finish();
      }
    });
  }

  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    const std::string what = describe("all_gather");
    check_cpu(input, what);
    check_list(outputs, static_cast<size_t>(size()), input, "outputs", what);
    return enqueue("all_gather", what, [this, outputs, input, what](uint32_t tag) {
      Staged in(input);
      Tensor flat = empty({size() * input.numel()}, TensorOptions(input.dtype(), kCPU));
      with_type(input.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllgatherOptions opts(context_);
        opts.setInput(in.ptr<T>(), in.count());
        opts.setOutput(static_cast<T*>(flat.raw_data()), flat.numel());
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::allgather(opts);
      });
      unflatten_into(flat, outputs);
    });
  }

  std::shared_ptr<Work> gather(const std::vector<Tensor>& outputs, const Tensor& input, int root) override {
    const std::string what = describe("gather");
    check_cpu(input, what);
    detail::check_rank(root, size(), "root", what);
    if (rank() == root) check_list(outputs, static_cast<size_t>(size()), input, "outputs", what);
    else
      WEFT_CHECK(outputs.empty(), what, ": only the root (", root, ") gives outputs; rank ", rank(), " gave ",
                 outputs.size());
    return enqueue("gather", what, [this, outputs, input, root, what](uint32_t tag) {
      Staged in(input);
      Tensor flat = rank() == root ? empty({size() * input.numel()}, TensorOptions(input.dtype(), kCPU)) : Tensor();
      with_type(input.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::GatherOptions opts(context_);
        opts.setInput(in.ptr<T>(), in.count());
        if (flat.defined()) opts.setOutput(static_cast<T*>(flat.raw_data()), flat.numel());
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::gather(opts);
      });
      if (flat.defined()) unflatten_into(flat, outputs);
    });
  }

  std::shared_ptr<Work> scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) override {
    const std::string what = describe("scatter");
    check_cpu(output, what);
    detail::check_rank(root, size(), "root", what);
    if (rank() == root) check_list(inputs, static_cast<size_t>(size()), output, "inputs", what);
    else
      WEFT_CHECK(inputs.empty(), what, ": only the root (", root, ") gives inputs; rank ", rank(), " gave ",
                 inputs.size());
    return enqueue("scatter", what, [this, output, inputs, root, what](uint32_t tag) {
      Staged out(output);
      std::vector<Tensor> sources;
      for (const Tensor& t : inputs) sources.push_back(t.contiguous());
      with_type(output.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::ScatterOptions opts(context_);
        if (!sources.empty()) {
          std::vector<T*> ptrs;
          for (const Tensor& t : sources) ptrs.push_back(static_cast<T*>(t.raw_data()));
          opts.setInputs(ptrs, out.count());
        }
        opts.setOutput(out.ptr<T>(), out.count());
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::scatter(opts);
      });
      out.finish();
    });
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) override {
    const std::string what = describe("reduce_scatter");
    check_cpu(output, what);
    check_reduce(output.dtype(), op, what);
    check_list(inputs, static_cast<size_t>(size()), output, "inputs", what);
    return enqueue("reduce_scatter", what, [this, output, inputs, op, what](uint32_t tag) {
      // An all-reduce of every rank's inputs, of which each rank keeps its own slice.
      Tensor flat = detail::flatten(inputs);
      with_type(output.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(static_cast<T*>(flat.raw_data()), flat.numel());
        opts.setReduceFunction(reduce_function<T>(op));
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::allreduce(opts);
      });
      NoGradGuard no_grad;
      Tensor mine = flat.narrow(0, rank() * output.numel(), output.numel()).view(output.shape());
      if (op == ReduceOp::Avg) detail::divide_in_place(mine, static_cast<double>(size()));
      output.detach().copy_(mine);
    });
  }

  std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) override {
    const std::string what = describe("all_to_all");
    WEFT_CHECK(!inputs.empty(), what, ": no inputs");
    check_cpu(inputs[0], what);
    check_list(inputs, static_cast<size_t>(size()), inputs[0], "inputs", what);
    check_list(outputs, static_cast<size_t>(size()), inputs[0], "outputs", what);
    return enqueue("all_to_all", what, [this, outputs, inputs, what](uint32_t tag) {
      Tensor in = detail::flatten(inputs);
      Tensor out = empty({in.numel()}, TensorOptions(in.dtype(), kCPU));
      with_type(in.dtype(), what, [&](auto zero) {
        using T = decltype(zero);
        gloo::AlltoallOptions opts(context_);
        opts.setInput(static_cast<T*>(in.raw_data()), in.numel());
        opts.setOutput(static_cast<T*>(out.raw_data()), out.numel());
        opts.setTag(tag);
        opts.setTimeout(timeout());
        gloo::alltoall(opts);
      });
      unflatten_into(out, outputs);
    });
  }

  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag) override {
    const std::string what = describe("send") + " to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
    check_cpu(tensor, what);
    detail::check_rank(dst, size(), "dst", what);
    WEFT_CHECK(dst != rank(), what, ": a rank cannot send to itself");
    WEFT_CHECK(tag >= 0, what, ": tags are non-negative");
    auto staged = std::make_shared<Tensor>(tensor.detach().contiguous());
    auto buffer = std::shared_ptr<gloo::transport::UnboundBuffer>(
        context_->createUnboundBuffer(staged->raw_data(), static_cast<size_t>(staged->nbytes())));
    buffer->send(dst, static_cast<uint64_t>(tag));
    return point_to_point(what, [buffer, staged](std::chrono::milliseconds t) { return buffer->waitSend(t); });
  }

  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag) override {
    const std::string what = describe("recv") + " from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
    check_cpu(tensor, what);
    detail::check_rank(src, size(), "src", what);
    WEFT_CHECK(src != rank(), what, ": a rank cannot receive from itself");
    WEFT_CHECK(tag >= 0, what, ": tags are non-negative");
    auto staged = std::make_shared<Staged>(tensor);
    auto buffer = std::shared_ptr<gloo::transport::UnboundBuffer>(context_->createUnboundBuffer(
        staged->tensor().raw_data(), static_cast<size_t>(staged->tensor().nbytes())));
    buffer->recv(src, static_cast<uint64_t>(tag));
    return point_to_point(what, [buffer, staged](std::chrono::milliseconds t) {
      if (!buffer->waitRecv(t)) return false;
      staged->finish();
      return true;
    });
  }

  std::shared_ptr<Work> barrier() override {
    const std::string what = describe("barrier");
    return enqueue("barrier", what, [this](uint32_t tag) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    });
  }

 private:
  // A send or receive. Gloo's unbound buffers are waited for by a thread that asks, so the
  // operation is known to be complete once a wait() has returned: is_completed() and
  // exception() say what the last wait() found, and never block. One thread waits at a
  // time; others wait for it.
  class PointToPointWork final : public Work {
   public:
    PointToPointWork(std::string what, std::chrono::milliseconds timeout,
                     std::function<bool(std::chrono::milliseconds)> wait_fn)
        : what_(std::move(what)), timeout_(timeout), wait_fn_(std::move(wait_fn)) {}
    void wait(std::chrono::milliseconds timeout) override {
      if (timeout.count() <= 0) timeout = timeout_;
      std::unique_lock lock(mutex_);
      if (waiting_) {
        const bool done = cv_.wait_for(lock, timeout, [&] { return done_; });
        WEFT_CHECK(done, what_, ": not done after ", timeout.count(), " ms");
      }
      if (!done_) {
        waiting_ = true;
        lock.unlock();
        std::exception_ptr error;
        try {
          if (!wait_fn_(timeout)) error = std::make_exception_ptr(Error(what_ + ": did not complete"));
        } catch (const std::exception& e) {
          error = std::make_exception_ptr(Error(what_ + ": " + e.what()));
        }
        lock.lock();
        error_ = error;
        done_ = true;
        waiting_ = false;
        cv_.notify_all();
      }
      if (error_) std::rethrow_exception(error_);
    }
    bool is_completed() override {
      std::lock_guard lock(mutex_);
      return done_;
    }
    std::exception_ptr exception() override {
      std::lock_guard lock(mutex_);
      return error_;
    }

   private:
    std::string what_;
    std::chrono::milliseconds timeout_;
    std::function<bool(std::chrono::milliseconds)> wait_fn_;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool done_ = false, waiting_ = false;
    std::exception_ptr error_;
  };

  std::string describe(const char* op) const {
    return std::string("ProcessGroupGloo ") + op + " (rank " + std::to_string(rank()) + " of " +
           std::to_string(size()) + ")";
  }

  void check_cpu(const Tensor& t, const std::string& what) const {
    WEFT_CHECK(t.defined(), what, ": the tensor is undefined");
    WEFT_CHECK(t.device().is_cpu(), what, ": the Gloo backend works on CPU tensors; this one is on ", t.device(),
               " (CUDA tensors take the nccl backend)");
  }

  // Queues a collective; its tag (the same on every rank: they queue in the same order)
  // keeps its messages apart from the others'.
  std::shared_ptr<Work> enqueue(const char* op, const std::string& what, std::function<void(uint32_t)> fn) {
    const uint32_t tag = next_tag_++;
    return queue_->enqueue(what, [this, op, fn = std::move(fn), tag] {
      TraceSpan span(op, lane_);  // on the group's communication lane of the trace
      fn(tag);
    });
  }

  std::shared_ptr<Work> point_to_point(const std::string& what, std::function<bool(std::chrono::milliseconds)> wait) {
    return std::make_shared<PointToPointWork>(what, timeout(), std::move(wait));
  }

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::atomic<uint32_t> next_tag_{0};
  Stream lane_{kCPU, nullptr};        // where the trace draws this group's collectives
  std::unique_ptr<WorkQueue> queue_;  // destroyed first: its operations use the context
};

}  // namespace

std::shared_ptr<ProcessGroup> new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                                             std::chrono::milliseconds timeout, const std::string& bind_host) {
  return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, timeout, bind_host);
}

}  // namespace weft::parallel
