// DeviceCommunicator: a collective library's connection among the ranks of a group, one
// device per rank (NCCL for CUDA devices).
//
// The parallel layer knows nothing of CUDA (docs/design.md): parallel/process_group/process_group_nccl.cpp
// orders its work with core's streams and events and issues the collectives through this
// interface; kernels/cuda/nccl_communicator.cpp implements it with NCCL and registers it at
// static initialisation (kept by the linker option --undefined=weft_nccl_registered, as
// the CUDA backend is). In a build without NCCL no library is registered and
// collective_library() says so.
//
// Every operation is queued on the stream given (a stream of the communicator's device) and
// returns at once; the tensors are contiguous, on the communicator's device, and stay alive
// until the stream has run the operation (the caller records them on the stream). Every
// rank of the group must queue the same operations in the same order.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/stream.h"

namespace weft {

class Tensor;

// The reductions of collectives (torch.distributed's ReduceOp; parallel/process_group/process_group.h
// names it ReduceOp). Avg is the sum divided by the group's size.
enum class CollectiveOp { Sum, Avg, Max, Min, Product };

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;  // flushes what is queued (bounded), then frees
  virtual Device device() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // output <- op over every rank's input (input and output may be the same tensor).
  virtual void all_reduce(const Tensor& input, const Tensor& output, CollectiveOp op, const Stream& stream) = 0;
  // output <- root's input.
  virtual void broadcast(const Tensor& input, const Tensor& output, int root, const Stream& stream) = 0;
  // On root: output <- op over every rank's input.
  virtual void reduce(const Tensor& input, const Tensor& output, int root, CollectiveOp op, const Stream& stream) = 0;
  // output (size() * input.numel() elements) <- every rank's input, in rank order.
  virtual void all_gather(const Tensor& input, const Tensor& output, const Stream& stream) = 0;
  // output <- op over every rank's input slice rank() (input holds size() * output.numel()).
  virtual void reduce_scatter(const Tensor& input, const Tensor& output, CollectiveOp op, const Stream& stream) = 0;
  // Point to point: messages between two ranks match in the order they were queued.
  virtual void send(const Tensor& tensor, int peer, const Stream& stream) = 0;
  virtual void recv(const Tensor& tensor, int peer, const Stream& stream) = 0;
  // The operations `calls` queues on this communicator start together (NCCL's group
  // calls): sends and receives that would wait for each other if queued one by one. The
  // group is closed even when `calls` throws; no other thread's call comes in between.
  virtual void grouped(const std::function<void()>& calls) = 0;

  // "" while healthy, else the library's description of an asynchronous failure (a peer
  // that went away, a network error). Never blocks.
  virtual std::string async_error() = 0;
  // Ends every queued operation, so that streams waiting for them go on (with garbage in
  // the operations' outputs); the communicator cannot be used afterwards.
  virtual void abort() noexcept = 0;
};

class CollectiveLibrary {
 public:
  virtual ~CollectiveLibrary() = default;
  virtual DeviceType type() const = 0;
  virtual std::string name() const = 0;     // "nccl"
  virtual std::string version() const = 0;  // "2.28.3"
  // A new communicator's id: rank 0 makes it and hands it to the others (the store does).
  virtual std::vector<uint8_t> new_id() = 0;
  // Joins communicator `id` as `rank` of `size` on `device`. Every rank must call it; one
  // that has not arrived within `timeout` makes the others fail with an error, not hang.
  // The communicator's later calls wait at most `timeout` to be queued.
  virtual std::unique_ptr<DeviceCommunicator> connect(Device device, const std::vector<uint8_t>& id, int rank,
                                                      int size, std::chrono::milliseconds timeout) = 0;
};

// Called by a library at static initialisation; a second one for a device type is an error.
void register_collective_library(CollectiveLibrary& library);
// The library for devices of `type`; throws saying why there is none (weft built without
// it) when there is none.
CollectiveLibrary& collective_library(DeviceType type);
bool has_collective_library(DeviceType type);

}  // namespace weft
