// NCCL behind DeviceCommunicator (kernels/device_communicator.h).
//
// Communicators are non-blocking (ncclConfig_t.blocking = 0): creating one and every call
// on it may return ncclInProgress, and the next call may be made only once
// ncclCommGetAsyncError says ncclSuccess (NCCL's rule for non-blocking communicators). That
// costs a poll per call, and buys bounded waits: a rank that never arrives makes the others'
// connect() fail after the timeout (with ncclCommAbort) instead of blocking them inside
// ncclCommInitRank for ever.
//
// NCCL has no bool: bool tensors travel as uint8 (max is logical or, min logical and).
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"
#include "kernels/device_communicator.h"

namespace weft::cuda {

namespace {

using Clock = std::chrono::steady_clock;

std::string describe(ncclResult_t status, ncclComm_t comm) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last && *last) text += std::string(" (") + last + ")";
  return text;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::Int32: return ncclInt32;
    case DType::UInt8:
    case DType::Bool: return ncclUint8;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
  }
  WEFT_FAIL("NCCL: no NCCL type for dtype ", dtype);
}

ncclRedOp_t nccl_op(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::Sum: return ncclSum;
    case CollectiveOp::Avg: return ncclAvg;
    case CollectiveOp::Max: return ncclMax;
    case CollectiveOp::Min: return ncclMin;
    case CollectiveOp::Product: return ncclProd;
  }
  return ncclSum;
}

// Polls a non-blocking communicator until its last call has left ncclInProgress, up to
// `bound` or until `stop` is set; returns its state then. Polls back to back at first (a
// call is usually queued at once), then every 100 us.
ncclResult_t settle(ncclComm_t comm, std::chrono::milliseconds bound, const std::atomic<bool>* stop = nullptr) {
  const auto deadline = Clock::now() + bound;
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) return query;
    if (state != ncclInProgress) return state;
    if ((stop && stop->load()) || Clock::now() > deadline) return ncclInProgress;
    if (polls < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class NcclCommunicator final : public DeviceCommunicator {
 public:
  NcclCommunicator(ncclComm_t comm, Device device, int rank, int size, std::chrono::milliseconds timeout)
      : comm_(comm), device_(device), rank_(rank), size_(size), timeout_(timeout) {}

  ~NcclCommunicator() override {
    std::lock_guard lock(mutex_);
    if (!comm_) return;  // aborted (ncclCommAbort freed it)
    DeviceGuard guard(device_);
    // Flush what is queued, bounded; a communicator that cannot finish is aborted instead.
    const ncclResult_t finalize = ncclCommFinalize(comm_);
    if ((finalize == ncclSuccess || finalize == ncclInProgress) && settle(comm_, timeout_) == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  Device device() const override { return device_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const Tensor& input, const Tensor& output, CollectiveOp op, const Stream& stream) override {
    issue("ncclAllReduce", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(input.raw_data(), output.raw_data(), static_cast<size_t>(input.numel()),
                           nccl_type(input.dtype()), nccl_op(op), comm, s);
    });
  }
  void broadcast(const Tensor& input, const Tensor& output, int root, const Stream& stream) override {
    issue("ncclBroadcast", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(input.raw_data(), output.raw_data(), static_cast<size_t>(output.numel()),
                           nccl_type(output.dtype()), root, comm, s);
    });
  }
  void reduce(const Tensor& input, const Tensor& output, int root, CollectiveOp op, const Stream& stream) override {
    issue("ncclReduce", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclReduce(input.raw_data(), output.raw_data(), static_cast<size_t>(input.numel()),
                        nccl_type(input.dtype()), nccl_op(op), root, comm, s);
    });
  }
  void all_gather(const Tensor& input, const Tensor& output, const Stream& stream) override {
    issue("ncclAllGather", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(input.raw_data(), output.raw_data(), static_cast<size_t>(input.numel()),
                           nccl_type(input.dtype()), comm, s);
    });
  }
  void reduce_scatter(const Tensor& input, const Tensor& output, CollectiveOp op, const Stream& stream) override {
    issue("ncclReduceScatter", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclReduceScatter(input.raw_data(), output.raw_data(), static_cast<size_t>(output.numel()),
                               nccl_type(output.dtype()), nccl_op(op), comm, s);
    });
  }
  void send(const Tensor& tensor, int peer, const Stream& stream) override {
    issue("ncclSend", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclSend(tensor.raw_data(), static_cast<size_t>(tensor.numel()), nccl_type(tensor.dtype()), peer, comm, s);
    });
  }
  void recv(const Tensor& tensor, int peer, const Stream& stream) override {
    issue("ncclRecv", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclRecv(tensor.raw_data(), static_cast<size_t>(tensor.numel()), nccl_type(tensor.dtype()), peer, comm, s);
    });
  }
  void grouped(const std::function<void()>& calls) override {
    std::lock_guard lock(mutex_);  // held throughout: abort() cannot free comm_ inside the group
    check_usable("ncclGroupStart");
    DeviceGuard guard(device_);
    check("ncclGroupStart", ncclGroupStart());
    in_group_ = true;
    try {
      calls();
    } catch (...) {
      in_group_ = false;
      ncclGroupEnd();  // NCCL's group state is per thread: never leave it open
      throw;
    }
    in_group_ = false;
    check("ncclGroupEnd", ncclGroupEnd());
    wait_until_queued("ncclGroupEnd");
  }

  std::string async_error() override {
    if (aborting_.load()) return "the communicator was aborted";
    // A call in progress holds the mutex while it polls the same state: ask next time.
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return "";
    if (!comm_) return "the communicator was aborted";
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) return describe(query, comm_);
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return describe(state, comm_);
  }

  void abort() noexcept override {
    aborting_.store(true);  // a call polling for its queueing stops, and lets go of the mutex
    std::lock_guard lock(mutex_);
    if (!comm_) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  template <class Call>
  void issue(const char* what, const Stream& stream, Call&& call) {
    WEFT_CHECK(stream.device() == device_, "NCCL ", what, ": stream of ", stream.device(), " for a communicator on ",
               device_);
    std::lock_guard lock(mutex_);
    check_usable(what);
    DeviceGuard guard(device_);
    check(what, call(comm_, native(stream)));
    if (!in_group_) wait_until_queued(what);  // inside a group, ncclGroupEnd queues them all
  }

  void check_usable(const char* what) const {
    WEFT_CHECK(comm_ != nullptr && !aborting_.load(), "NCCL ", what, " (rank ", rank_, " of ", size_, ", ", device_,
               "): the communicator was aborted after an earlier failure or timeout");
  }
  void check(const char* what, ncclResult_t status) const {
    WEFT_CHECK(status == ncclSuccess || status == ncclInProgress, "NCCL ", what, " (rank ", rank_, " of ", size_, ", ",
               device_, ") failed: ", describe(status, comm_));
  }
  void wait_until_queued(const char* what) const {
    const ncclResult_t state = settle(comm_, timeout_, &aborting_);
    WEFT_CHECK(state != ncclInProgress, "NCCL ", what, " (rank ", rank_, " of ", size_, ", ", device_,
               "): not queued after ", timeout_.count(), " ms");
    check(what, state);
  }

  // One call (or group of calls) at a time; abort() waits for the one in progress. Recursive:
  // the calls of grouped() take it again.
  mutable std::recursive_mutex mutex_;
  bool in_group_ = false;
  ncclComm_t comm_;
  Device device_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborting_{false};
};

class NcclLibrary final : public CollectiveLibrary {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  std::string name() const override { return "nccl"; }
  std::string version() const override {
    int code = 0;
    ncclGetVersion(&code);
    // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
    return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
  }

  std::vector<uint8_t> new_id() override {
    ncclUniqueId id;
    const ncclResult_t status = ncclGetUniqueId(&id);
    WEFT_CHECK(status == ncclSuccess, "NCCL: ncclGetUniqueId failed: ", describe(status, nullptr));
    std::vector<uint8_t> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    return bytes;
  }

  std::unique_ptr<DeviceCommunicator> connect(Device device, const std::vector<uint8_t>& id, int rank, int size,
                                              std::chrono::milliseconds timeout) override {
    WEFT_CHECK(device.is_cuda(), "NCCL: communicators live on CUDA devices, not ", device);
    ncclUniqueId uid;
    WEFT_CHECK(id.size() == sizeof uid, "NCCL: a communicator id has ", sizeof uid, " bytes, got ", id.size());
    std::memcpy(&uid, id.data(), sizeof uid);
    DeviceGuard guard(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t status = ncclCommInitRankConfig(&comm, size, uid, rank, &config);
    if (status != ncclSuccess && status != ncclInProgress) {
      const std::string why = describe(status, comm);
      if (comm) ncclCommAbort(comm);
      WEFT_FAIL("NCCL: rank ", rank, " of ", size, " on ", device, " could not create its communicator: ", why);
    }
    const ncclResult_t state = settle(comm, timeout);
    if (state != ncclSuccess) {
      const std::string why = state == ncclInProgress
                                  ? "the other ranks did not all join within " + std::to_string(timeout.count()) +
                                        " ms (are they all running? ranks that share a GPU need NCCL_HOSTIDs of "
                                        "their own, which weft-run sets)"
                                  : describe(state, comm);
      ncclCommAbort(comm);
      WEFT_FAIL("NCCL: rank ", rank, " of ", size, " on ", device, " could not connect: ", why);
    }
    return std::make_unique<NcclCommunicator>(comm, device, rank, size, timeout);
  }
};

bool register_nccl() {
  static NcclLibrary library;
  register_collective_library(library);
  return true;
}

}  // namespace

}  // namespace weft::cuda

extern "C" {
// The anchor the linker is told to keep (CMakeLists.txt); its initialiser registers NCCL.
extern const bool weft_nccl_registered;
const bool weft_nccl_registered = weft::cuda::register_nccl();
}
