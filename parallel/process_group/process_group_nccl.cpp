// ProcessGroupNccl: weft's collectives on CUDA tensors through NCCL; see process_group_nccl.h.
// This file holds the group (its channels, how it queues operations, how it fails); the Work of
// one operation and the watchdog that polls them are in nccl_work.h, and read the group's state
// only through NcclWatchdog::Group.
#include "parallel/process_group/process_group_nccl.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

#include "core/autograd.h"
#include "core/error.h"
#include "core/stream.h"
#include "core/trace.h"
#include "kernels/device_communicator.h"
#include "kernels/elementwise.h"
#include "parallel/process_group/collective_support.h"
#include "parallel/process_group/nccl_work.h"
#include "parallel/process_group/work_queue.h"

namespace weft::parallel {

bool nccl_available() { return has_collective_library(DeviceType::CUDA) && cuda_available(); }

namespace {

using detail::check_list;
using detail::check_reduce;
using detail::kConnectBound;
using detail::NcclWatchdog;
using detail::NcclWork;
using detail::Staged;

// How long a thread that meets a failure waits for the thread that is ending the process
// before it ends the process itself.
constexpr std::chrono::milliseconds kEndingBound{30000};

// A thread that meets a failure while another thread ends the process because of it
// (ProcessGroupNccl::fail_group) waits for that end instead of throwing: otherwise a caller
// that catches the error could end the process first, with a status of its own, before the
// failure was even reported (a rank whose peer died could exit 0).
[[noreturn]] void await_process_end(int rank, const std::string& failure) {
  std::this_thread::sleep_for(kEndingBound);
  std::cerr << "weft: rank " << rank << ": process group nccl: " << failure << "; ending the process" << std::endl;
  std::_Exit(1);
}

// A communicator and the stream its operations run on. Point-to-point channels have an
// issuing thread of their own, which connects the communicator and queues the sends or
// receives asked for meanwhile: a rank's first send to a peer must not block the caller
// while that peer is still connecting to another (ranks in a ring each send first). Once
// connected, with nothing left for the issuer, the caller queues them itself (Note [Sends
// and receives on the caller's thread]).
struct Channel {
  explicit Channel(Stream s, std::unique_ptr<WorkQueue> issuing_thread = nullptr)
      : stream(std::move(s)), issuer(std::move(issuing_thread)) {}

  Stream stream;
  std::unique_ptr<DeviceCommunicator> comm;  // on p2p channels set by the issuer (under the group's mutex)
  std::mutex queueing;                       // p2p: held while one is queued, by the caller or the issuer
  int with_issuer = 0;                       // p2p: sends or receives the issuer has yet to queue (group's mutex)
  std::unique_ptr<WorkQueue> issuer;         // p2p channels only; destroyed (joined) first
};

class ProcessGroupNccl final : public ProcessGroup, private NcclWatchdog::Group {
 public:
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size, timeout), store_(std::move(store)), library_(collective_library(DeviceType::CUDA)) {
    WEFT_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroupNccl: rank ", rank, " of a group of ", size);
    WEFT_CHECK(cuda_available(), "ProcessGroupNccl: the nccl backend needs a GPU: ", cuda_unavailable_reason());
    const char* handling = std::getenv("WEFT_NCCL_ASYNC_ERROR_HANDLING");
    end_process_on_failure_ = !(handling && std::string(handling) == "0");
    watchdog_ = std::make_unique<NcclWatchdog>(static_cast<NcclWatchdog::Group&>(*this), timeout);
  }

  ~ProcessGroupNccl() override {
    watchdog_.reset();  // stops and joins its thread
    // The issuing threads first (they use the group), then every communicator flushes what
    // is queued (bounded) and is freed.
    std::map<std::pair<int, int>, std::unique_ptr<Channel>> pairs;
    {
      std::lock_guard lock(mutex_);
      pairs.swap(pairs_);
    }
    for (auto& [key, channel] : pairs) channel->issuer.reset();
  }

  std::string backend_name() const override { return "nccl"; }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op) override {
    const std::string what = describe("all_reduce");
    check_cuda(tensor, what);
    check_reduce(tensor.dtype(), op, what);
    return launch("all_reduce", what, tensor.device(), collective_channel(tensor.device()), {tensor},
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    Staged io(tensor);
                    comm.all_reduce(io.tensor(), io.tensor(), op, stream);
                    io.finish();
                  });
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override {
    const std::string what = describe("broadcast");
    check_cuda(tensor, what);
    detail::check_rank(root, size(), "root", what);
    return launch("broadcast", what, tensor.device(), collective_channel(tensor.device()), {tensor},
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    Staged io(tensor);
                    comm.broadcast(io.tensor(), io.tensor(), root, stream);
                    io.finish();
                  });
  }

  std::shared_ptr<Work> reduce(const Tensor& tensor, int root, ReduceOp op) override {
    const std::string what = describe("reduce");
    check_cuda(tensor, what);
    detail::check_rank(root, size(), "root", what);
    check_reduce(tensor.dtype(), op, what);
    return launch("reduce", what, tensor.device(), collective_channel(tensor.device()), {tensor},
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    // NCCL writes the output on the root only: in place leaves the others' as they were.
                    Staged io(tensor);
                    comm.reduce(io.tensor(), io.tensor(), root, op, stream);
                    if (rank() == root) io.finish();
                  });
  }

  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    const std::string what = describe("all_gather");
    check_cuda(input, what);
    check_list(outputs, static_cast<size_t>(size()), input, "outputs", what);
    return launch("all_gather", what, input.device(), collective_channel(input.device()), with(outputs, input),
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    Staged in(input);
                    Tensor flat = empty({size() * input.numel()}, TensorOptions(input.dtype(), input.device()));
                    comm.all_gather(in.tensor(), flat, stream);
                    detail::unflatten_into(flat, outputs);
                  });
  }

  std::shared_ptr<Work> gather(const std::vector<Tensor>& outputs, const Tensor& input, int root) override {
    const std::string what = describe("gather");
    check_cuda(input, what);
    detail::check_rank(root, size(), "root", what);
    if (rank() == root) check_list(outputs, static_cast<size_t>(size()), input, "outputs", what);
    else
      WEFT_CHECK(outputs.empty(), what, ": only the root (", root, ") gives outputs; rank ", rank(), " gave ",
                 outputs.size());
    // NCCL has no gather: the root receives from every rank, in one group of calls.
    return launch("gather", what, input.device(), collective_channel(input.device()), with(outputs, input),
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    Staged in(input);
                    if (rank() != root) {
                      comm.send(in.tensor(), root, stream);
                      return;
                    }
                    std::vector<Staged> landed;
                    for (const Tensor& out : outputs) landed.emplace_back(out);
                    comm.grouped([&] {
                      for (int r = 0; r < size(); ++r)
                        if (r != root) comm.recv(landed[r].tensor(), r, stream);
                    });
                    outputs[root].detach().copy_(in.tensor());
                    for (int r = 0; r < size(); ++r)
                      if (r != root) landed[r].finish();
                  });
  }

  std::shared_ptr<Work> scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) override {
    const std::string what = describe("scatter");
    check_cuda(output, what);
    detail::check_rank(root, size(), "root", what);
    if (rank() == root) check_list(inputs, static_cast<size_t>(size()), output, "inputs", what);
    else
      WEFT_CHECK(inputs.empty(), what, ": only the root (", root, ") gives inputs; rank ", rank(), " gave ",
                 inputs.size());
    return launch("scatter", what, output.device(), collective_channel(output.device()), with(inputs, output),
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    Staged out(output);
                    if (rank() != root) {
                      comm.recv(out.tensor(), root, stream);
                      out.finish();
                      return;
                    }
                    std::vector<Tensor> sources;
                    for (const Tensor& t : inputs) sources.push_back(t.detach().contiguous());
                    comm.grouped([&] {
                      for (int r = 0; r < size(); ++r)
                        if (r != root) comm.send(sources[r], r, stream);
                    });
                    out.tensor().copy_(sources[root]);
                    out.finish();
                  });
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) override {
    const std::string what = describe("reduce_scatter");
    check_cuda(output, what);
    check_reduce(output.dtype(), op, what);
    check_list(inputs, static_cast<size_t>(size()), output, "inputs", what);
    return launch("reduce_scatter", what, output.device(), collective_channel(output.device()), with(inputs, output),
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    Tensor flat = detail::flatten(inputs);
                    Staged out(output);
                    comm.reduce_scatter(flat, out.tensor(), op, stream);
                    out.finish();
                  });
  }

  std::shared_ptr<Work> all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) override {
    const std::string what = describe("all_to_all");
    WEFT_CHECK(!inputs.empty(), what, ": no inputs");
    check_cuda(inputs[0], what);
    check_list(inputs, static_cast<size_t>(size()), inputs[0], "inputs", what);
    check_list(outputs, static_cast<size_t>(size()), inputs[0], "outputs", what);
    std::vector<Tensor> all = inputs;
    all.insert(all.end(), outputs.begin(), outputs.end());
    return launch("all_to_all", what, inputs[0].device(), collective_channel(inputs[0].device()), all,
                  [&](DeviceCommunicator& comm, const Stream& stream) {
                    std::vector<Tensor> sources;
                    std::vector<Staged> landed;
                    for (const Tensor& t : inputs) sources.push_back(t.detach().contiguous());
                    for (const Tensor& t : outputs) landed.emplace_back(t);
                    comm.grouped([&] {
                      for (int r = 0; r < size(); ++r) {
                        if (r == rank()) continue;
                        comm.send(sources[r], r, stream);
                        comm.recv(landed[r].tensor(), r, stream);
                      }
                    });
                    landed[rank()].tensor().copy_(sources[rank()]);
                    for (const Staged& s : landed) s.finish();
                  });
  }

  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag) override {
    const std::string what = describe("send") + " to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
    check_cuda(tensor, what);
    detail::check_rank(dst, size(), "dst", what);
    WEFT_CHECK(dst != rank(), what, ": a rank cannot send to itself");
    WEFT_CHECK(tag >= 0, what, ": tags are non-negative");
    return launch_p2p("send", what, p2p_channel(rank(), dst, tensor.device()), tensor,
                      [tensor](DeviceCommunicator& comm, const Stream& stream) {
                        comm.send(tensor.detach().contiguous(), /*peer=*/1, stream);
                      });
  }

  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag) override {
    const std::string what =
        describe("recv") + " from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
    check_cuda(tensor, what);
    detail::check_rank(src, size(), "src", what);
    WEFT_CHECK(src != rank(), what, ": a rank cannot receive from itself");
    WEFT_CHECK(tag >= 0, what, ": tags are non-negative");
    return launch_p2p("recv", what, p2p_channel(src, rank(), tensor.device()), tensor,
                      [tensor](DeviceCommunicator& comm, const Stream& stream) {
                        Staged io(tensor);
                        comm.recv(io.tensor(), /*peer=*/0, stream);
                        io.finish();
                      });
  }

  // An all-reduce of one element on this rank's device; its wait() blocks the host.
  std::shared_ptr<Work> barrier() override {
    const std::string what = describe("barrier");
    const Device device = barrier_device();
    Tensor token = zeros({1}, TensorOptions(DType::Float32, device));
    return launch(
        "barrier", what, device, collective_channel(device), {token},
        [&](DeviceCommunicator& comm, const Stream& stream) { comm.all_reduce(token, token, ReduceOp::Sum, stream); },
        /*host_waits=*/true);
  }

 private:
  std::string describe(const char* op) const {
    return std::string("ProcessGroupNccl ") + op + " (rank " + std::to_string(rank()) + " of " +
           std::to_string(size()) + ")";
  }

  static void check_cuda(const Tensor& t, const std::string& what) {
    WEFT_CHECK(t.defined(), what, ": the tensor is undefined");
    WEFT_CHECK(t.device().is_cuda(), what, ": the nccl backend works on CUDA tensors; this one is on ", t.device(),
               " (CPU tensors take the gloo backend)");
  }

  static std::vector<Tensor> with(std::vector<Tensor> list, const Tensor& one) {
    list.push_back(one);
    return list;
  }

  // The device the last collective used, else cuda:(LOCAL_RANK, or the group rank, mod the
  // devices), as PyTorch guesses.
  Device barrier_device() {
    std::lock_guard lock(mutex_);
    if (last_device_) return *last_device_;
    const char* local = std::getenv("LOCAL_RANK");
    return Device::cuda((local && *local ? std::atoi(local) : rank()) % cuda_device_count());
  }

  // Queues `issue` on the channel's stream after the caller's current stream, records the
  // tensors there and returns the Work that ends with it. A failure to queue it fails the
  // group (its communicators may be left mid-call).
  template <class Issue>
  std::shared_ptr<Work> launch(const char* op, const std::string& what, Device device, Channel& channel,
                               const std::vector<Tensor>& tensors, Issue&& issue, bool host_waits = false) {
    throw_if_failed(what);
    auto work = std::make_shared<NcclWork>(what, device, host_waits, timeout());
    try {
      Event ready;
      ready.record(current_stream(device));
      ready.block(channel.stream);
      issue_traced(op, channel, issue);
      for (const Tensor& t : tensors)
        if (t.defined()) record_stream(t, channel.stream);
      Event done;
      done.record(channel.stream);
      work->queued(std::move(done));
    } catch (const std::exception& e) {
      fail_group(what + " could not be queued: " + e.what());
      throw;
    }
    track(work, device);
    return work;
  }

  // A send or receive, after the caller's current stream as it is now: queued on the
  // channel's stream by the caller once its communicator is connected and the issuing thread
  // has nothing left, by the issuing thread before (Note [Sends and receives on the caller's
  // thread]).
  template <class Issue>
  std::shared_ptr<Work> launch_p2p(const char* op, const std::string& what, Channel& channel, const Tensor& tensor,
                                   Issue&& issue) {
    throw_if_failed(what);
    const Device device = tensor.device();
    auto work = std::make_shared<NcclWork>(what, device, /*host_waits=*/false, timeout());
    auto ready = std::make_shared<Event>();
    ready->record(current_stream(device));
    track(work, device);
    // Queues it on the channel's stream (with `queueing` held): the event that ends it, or
    // none when the group failed.
    auto queue = [this, op, &channel, what, work, ready, tensor, issue = std::forward<Issue>(issue)] {
      std::optional<Event> done;
      if (work->failed()) return done;
      try {
        WEFT_CHECK(channel.comm != nullptr, "its communicator did not connect");
        ready->block(channel.stream);
        issue_traced(op, channel, issue);
        record_stream(tensor, channel.stream);
        done.emplace();
        done->record(channel.stream);
      } catch (const std::exception& e) {
        done.reset();
        fail_group(what + " could not be queued: " + e.what());
      }
      return done;
    };
    bool here = false;
    {
      std::lock_guard lock(mutex_);
      here = channel.comm != nullptr && channel.with_issuer == 0;
      if (!here) ++channel.with_issuer;
    }
    if (here) {
      std::lock_guard queueing(channel.queueing);
      if (auto done = queue()) work->queued(std::move(*done));
      return work;
    }
    channel.issuer->enqueue(what, [this, &channel, work, queue = std::move(queue)] {
      std::lock_guard queueing(channel.queueing);
      std::optional<Event> done = queue();
      {
        std::lock_guard lock(mutex_);
        --channel.with_issuer;  // before the work says it is queued: a caller waiting for that goes on here
      }
      if (done) work->queued(std::move(*done));
    });
    return work;
  }

  // Note [Sends and receives on the caller's thread]: a send queued by another thread can
  // wait there for the CUDA driver while the caller waits on the GPU for the peer, and the
  // peer likewise, for ever. 1F1B over two NCCL ranks can meet it: each rank's main thread
  // reads a received header (a device-to-host copy, waiting inside the driver for the
  // receive) while each rank's issuing thread, holding the send the other rank's receive
  // needs, waits inside cuEventCreate for a lock of the driver. So only a channel's
  // first operations go through its issuing thread: those asked for before its communicator
  // connected, and after it the ones asked for while any of those is still waiting there
  // (NCCL's first message on a communicator connects its peers, which may take a while). Once
  // the issuer has none left, the caller queues each send and receive itself, as it does every
  // collective: a rank's sends are on the GPU before it waits for anything. The caller decides
  // under the group's mutex, so it never waits for the issuer's NCCL calls; the channel's
  // `queueing` mutex keeps the two from queueing at once. DistributedPipeline connects its
  // pairs before the first step (connect_peers), so its steps queue every message on the
  // caller's thread. The watchdog (nccl_work.h) asks whether operations are done, and lets go
  // of finished ones (their events), outside the group's mutex: a driver that makes
  // cudaEventQuery or cudaEventDestroy wait must not make the callers wait with it.

  // Runs `issue` on the channel's stream (staging copies run there too, in order). While a
  // trace records, it is a device span named `op` on the channel's lane: when the GPU ran the
  // operation, not when the host queued it.
  template <class Issue>
  static void issue_traced(const char* op, Channel& channel, const Issue& issue) {
    NoGradGuard no_grad;
    StreamGuard on_channel(channel.stream);
    DeviceTraceSpan span(op, channel.stream.device());  // on the current stream: the channel's
    issue(*channel.comm, channel.stream);
  }

  // The watchdog looks after `work` from now on (a group that failed meanwhile fails it).
  void track(const std::shared_ptr<NcclWork>& work, Device device) {
    std::lock_guard lock(mutex_);
    if (ending_) await_process_end(rank(), failure_);
    if (!failure_.empty()) work->fail(failure_);
    in_flight_.push_back(work);
    last_device_ = device;
  }

  Channel& collective_channel(Device device) {
    std::lock_guard lock(mutex_);
    throw_if_failed_locked("a collective");
    auto it = collectives_.find(device.index);
    if (it != collectives_.end()) return *it->second;
    const std::string key = "nccl/collective/" + std::to_string(communicators_made_++);
    auto channel = std::make_unique<Channel>(new_stream(device));
    trace::name_lane(channel->stream, "nccl (rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ")");
    try {
      channel->comm = connect(key, /*maker=*/rank() == 0, device, rank(), size());
    } catch (const std::exception& e) {
      failure_ = std::string("connecting its communicator on ") + device.str() + ": " + e.what();
      throw;
    }
    return *collectives_.emplace(device.index, std::move(channel)).first->second;
  }

  // The two-rank communicator for messages from `src` to `dst` (rank 0 in it is src): one
  // per direction, so that a rank's sends to a peer and its receives from it run on streams
  // of their own and never wait for each other. Its issuing thread connects it first.
  Channel& p2p_channel(int src, int dst, Device device) {
    std::lock_guard lock(mutex_);
    throw_if_failed_locked("a send or receive");
    const std::pair<int, int> direction{src, dst};
    const int peer = src == rank() ? dst : src;
    auto it = pairs_.find(direction);
    if (it != pairs_.end()) {
      WEFT_CHECK(it->second->stream.device() == device, describe("send/recv"), ": messages ",
                 src == rank() ? "to" : "from", " rank ", peer, " go through ", it->second->stream.device(),
                 " (the first one did); this tensor is on ", device);
      return *it->second;
    }
    auto channel = std::make_unique<Channel>(new_stream(device), std::make_unique<WorkQueue>(timeout()));
    trace::name_lane(channel->stream, src == rank() ? "nccl sends to rank " + std::to_string(dst)
                                                    : "nccl receives from rank " + std::to_string(src));
    const std::string key = "nccl/p2p/" + std::to_string(src) + "-" + std::to_string(dst);
    const std::string what = describe("connect") + " for messages " + (src == rank() ? "to" : "from") + " rank " +
                             std::to_string(peer);
    channel->issuer->enqueue(what, [this, ch = channel.get(), key, device, src, what] {
      try {
        auto comm = connect(key, /*maker=*/rank() == src, device, rank() == src ? 0 : 1, 2);
        std::lock_guard lock(mutex_);
        ch->comm = std::move(comm);
      } catch (const std::exception& e) {
        fail_group(what + ": " + e.what());
      }
    });
    return *pairs_.emplace(direction, std::move(channel)).first->second;
  }

  // Rank 0 of the communicator makes its id and hands it over through the store. Making one
  // waits for the others up to kConnectBound at least, whatever the group's timeout.
  std::unique_ptr<DeviceCommunicator> connect(const std::string& key, bool maker, Device device, int rank_in,
                                              int size_in) {
    Bytes id;
    if (maker) {
      id = library_.new_id();
      store_->set(key, id);
    } else {
      id = store_->get(key);  // waits up to the store's timeout
    }
    return library_.connect(device, id, rank_in, size_in, std::max(timeout(), kConnectBound));
  }

  void throw_if_failed(const std::string& what) {
    std::lock_guard lock(mutex_);
    throw_if_failed_locked(what);
  }
  void throw_if_failed_locked(const std::string& what) const {
    if (ending_) await_process_end(rank(), failure_);
    WEFT_CHECK(failure_.empty(), what, ": the group failed earlier and its communicators were aborted: ", failure_);
  }

  // --- what the watchdog reads and changes (NcclWatchdog::Group) ---------------------
  bool in_flight(std::vector<std::shared_ptr<NcclWork>>& works, std::vector<DeviceCommunicator*>& comms) override {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) return false;
    works = in_flight_;
    comms = communicators_locked();
    return true;
  }

  void forget(const std::unordered_set<const NcclWork*>& finished) override {
    std::lock_guard lock(mutex_);
    std::erase_if(in_flight_, [&](const std::shared_ptr<NcclWork>& w) { return finished.count(w.get()) > 0; });
  }

  std::vector<DeviceCommunicator*> communicators_locked() const {
    std::vector<DeviceCommunicator*> comms;
    for (auto& [index, channel] : collectives_) comms.push_back(channel->comm.get());
    for (auto& [pair, channel] : pairs_)
      if (channel->comm) comms.push_back(channel->comm.get());
    return comms;
  }

  // The first failure ends the process by default: reported, then _Exit(1) at once (the
  // driver ends its kernels; a thread that meets the failure meanwhile waits for the end,
  // await_process_end). With WEFT_NCCL_ASYNC_ERROR_HANDLING=0 it fails every operation in
  // flight and aborts every communicator, so that no stream waits for ever.
  void fail_group(const std::string& failure) override {
    std::vector<std::shared_ptr<NcclWork>> works;
    std::vector<DeviceCommunicator*> comms;
    {
      std::unique_lock lock(mutex_);
      if (!failure_.empty()) {  // failed already; a caller whose queueing failed meanwhile waits for the end too
        if (!ending_) return;
        const std::string earlier = failure_;
        lock.unlock();
        await_process_end(rank(), earlier);
      }
      failure_ = failure;
      ending_ = end_process_on_failure_;
      works = in_flight_;
      comms = communicators_locked();
    }
    if (end_process_on_failure_) {
      std::cerr << "weft: rank " << rank() << ": process group nccl: " << failure
                << "; ending the process (WEFT_NCCL_ASYNC_ERROR_HANDLING=0 keeps it)" << std::endl;
      std::_Exit(1);
    }
    // Nothing here may throw before the communicators are aborted and the process ends: after
    // a sticky CUDA error (what the watchdog may be reporting) every event query throws.
    for (const auto& work : works) {
      bool finished = false;
      try {
        finished = work->done();
      } catch (const std::exception&) {
      }
      if (!finished) work->fail(failure);
    }
    for (DeviceCommunicator* comm : comms) comm->abort();  // noexcept
    std::cerr << "weft: rank " << rank() << ": process group nccl: " << failure << "; its communicators were aborted"
              << std::endl;
  }

  std::shared_ptr<Store> store_;
  CollectiveLibrary& library_;
  bool end_process_on_failure_ = true;

  std::mutex mutex_;  // what follows
  std::map<int, std::unique_ptr<Channel>> collectives_;             // device index -> channel
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> pairs_;  // (lower, higher rank) -> channel
  int64_t communicators_made_ = 0;
  std::vector<std::shared_ptr<NcclWork>> in_flight_;
  std::optional<Device> last_device_;
  std::string failure_;
  bool ending_ = false;  // fail_group is ending the process because of failure_

  std::unique_ptr<NcclWatchdog> watchdog_;  // made last, in the constructor; stopped first, in the destructor
};

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                             std::chrono::milliseconds timeout) {
  return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, timeout);
}

}  // namespace weft::parallel
