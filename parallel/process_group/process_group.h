// ProcessGroup: collectives among the processes of a job (PyTorch's c10d ProcessGroup).
//
// Each process ("rank") holds one ProcessGroup per group it belongs to; every rank of the
// group must call the same collectives in the same order, with tensors of the same shapes
// and dtypes (WEFT_DISTRIBUTED_DEBUG=1 checks that, parallel/process_group/distributed.h). Collectives
// work in place on the tensors given, as torch.distributed's do, and return a Work handle:
// the call returns once the operation is queued; Work::wait() returns once it is done (or
// rethrows its error). Backends: Gloo for CPU tensors (process_group_gloo.h); NCCL for CUDA
// tensors (process_group_nccl.h), whose wait() orders the caller's current stream after the
// operation instead of blocking the host, as PyTorch's does.
//
//   auto work = group.all_reduce(grad, ReduceOp::Sum);   // queued
//   ...                                                 // overlap other work
//   work->wait();                                       // grad holds the sum over ranks
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/device_communicator.h"

namespace weft::parallel {

// Sum, Avg (the sum divided by the group's size; floating dtypes), Max, Min, Product.
using ReduceOp = CollectiveOp;
const char* reduce_op_name(ReduceOp op);

// One queued operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is done, up to `timeout` (the group's when zero), then
  // rethrows its error if it failed; an operation still running after the timeout is an
  // error naming it.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
  // Done, successfully or not (never blocks).
  virtual bool is_completed() = 0;
  // The error it failed with (null while running or after success).
  virtual std::exception_ptr exception() = 0;
};

// A Work that is done once `work` is done and `continuation` has run after it: the
// continuation runs once, on the thread that first finds `work` done (in wait() or
// is_completed()), and an error from either is this Work's error (PyTorch's Future.then;
// the compression hooks widen their result back into the bucket with one).
std::shared_ptr<Work> then(std::shared_ptr<Work> work, std::function<void()> continuation);
// A Work that is done already and succeeded (a hook with nothing to send).
std::shared_ptr<Work> completed_work();

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, std::chrono::milliseconds timeout) : rank_(rank), size_(size), timeout_(timeout) {}
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }  // this process's rank within the group
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  virtual std::string backend_name() const = 0;

  // tensor <- op over every rank's tensor (Avg: the sum divided by size(), floating only).
  virtual std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // tensor <- root's tensor.
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) = 0;
  // root's tensor <- op over every rank's tensor; the others' tensors are left as they were.
  virtual std::shared_ptr<Work> reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum) = 0;
  // outputs[r] <- rank r's input; size() outputs, each shaped like input.
  virtual std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // On root: outputs[r] <- rank r's input (size() outputs); elsewhere outputs must be empty.
  virtual std::shared_ptr<Work> gather(const std::vector<Tensor>& outputs, const Tensor& input, int root) = 0;
  // output <- root's inputs[rank()]; inputs given on root only (size() of them).
  virtual std::shared_ptr<Work> scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) = 0;
  // output <- op over every rank's inputs[rank()] (size() inputs, each shaped like output).
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  // outputs[r] <- rank r's inputs[rank()] (size() of each, one shape and dtype throughout).
  virtual std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) = 0;
  // Point to point: the message with `tag` from this rank to `dst` is what `dst`'s recv
  // with the same tag from this rank receives (same shape and dtype on both sides).
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) = 0;
  // Returns (through wait()) once every rank has called it.
  virtual std::shared_ptr<Work> barrier() = 0;

  // Numbers 0, 1, 2, ... for algorithms made of sends and receives (the ring all-reduce,
  // pipeline schedules): every rank takes them in the same order, so one call's messages
  // get tags no other call uses.
  int64_t next_round() { return next_round_.fetch_add(1, std::memory_order_relaxed); }

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<int64_t> next_round_{0};
};

}  // namespace weft::parallel
