// One rank of the multi-process tests (test_process_group.cpp starts several):
//
//   process_group_worker SCENARIO      (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, or
//                                       Slurm's / Open MPI's variables)
//
// WEFT_TEST_BACKEND=nccl runs the same scenarios on CUDA tensors (cuda:LOCAL_RANK modulo the
// devices) through the nccl backend; the default is gloo on CPU tensors.
//
// Each scenario joins the job through init_process_group and checks what a rank
// can check on its own against a serial computation of every rank's contribution (inputs
// are a function of the rank, so every rank knows them all). It prints "ok: ..." lines and
// exits 0, or prints "FAIL: ..." and exits 1.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <weft.h>

#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/parallel_plan.h"
#include "parallel/pipeline/pipeline_mesh.h"
#include "parallel/process_group/connect_peers.h"
#include "parallel/process_group/distributed.h"
#include "parallel/process_group/monitored_barrier.h"
#include "parallel/process_group/ring_allreduce.h"
#include "worker_backend.h"

using namespace weft;
using namespace weft::parallel;

namespace {

int failures = 0;

// The backend under test, and the device its tensors live on.
std::string backend() { return test::worker_backend(); }
Device device() { return test::worker_device(); }
TensorOptions on_device(DType dtype = DType::Float32) { return TensorOptions(dtype, device()); }

void fail(const std::string& what) {
  std::cout << "FAIL: rank " << get_rank() << ": " << what << std::endl;
  ++failures;
}

// Rank r's input: element i is (r + 1) * (i % 7 + 1) (small integers: exact in every dtype
// and in every reduction below), or (r + i) % 2 for bool.
Tensor input(int r, int64_t n, DType dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = dtype == DType::Bool ? (r + i) % 2 : (r + 1) * (i % 7 + 1);
  return tensor(v, Shape{n}).to(dtype).to(device());
}

template <class T>
T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<T>(a + b);
    case ReduceOp::Product: return static_cast<T>(a * b);
    case ReduceOp::Max: return std::max(a, b);
    case ReduceOp::Min: return std::min(a, b);
  }
  return a;
}

// The serial reduction over `ranks` of their inputs, in the dtype (so integer wrap-around
// and float rounding are those of the tensors).
Tensor expected_reduction(const std::vector<int>& ranks, int64_t n, DType dtype, ReduceOp op) {
  std::vector<std::vector<double>> inputs;
  for (int r : ranks) inputs.push_back(input(r, n, dtype).to(DType::Float64).to_vector<double>());
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    auto value = [&](auto zero) {
      using T = decltype(zero);
      T acc = static_cast<T>(inputs[0][i]);
      for (size_t k = 1; k < ranks.size(); ++k) acc = combine<T>(op, acc, static_cast<T>(inputs[k][i]));
      double result = static_cast<double>(acc);
      if (op == ReduceOp::Avg) result /= static_cast<double>(ranks.size());
      return result;
    };
    switch (dtype) {
      case DType::Float32: out[i] = value(float{}); break;
      case DType::Float64: out[i] = value(double{}); break;
      case DType::Int64: out[i] = value(int64_t{}); break;
      case DType::Int32: out[i] = value(int32_t{}); break;
      case DType::Float16:
      case DType::BFloat16: out[i] = value(double{}); break;  // rounded once, below
      default: out[i] = value(uint8_t{}); break;
    }
  }
  return tensor(out, Shape{n}).to(dtype);
}

// Equal, up to float32's rounding (`rtol`).
bool same(const Tensor& a, const Tensor& b, double rtol = 1e-6) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  auto x = a.to(DType::Float64).to_vector<double>(), y = b.to(DType::Float64).to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || std::fabs(x[i] - y[i]) <= rtol * std::fabs(y[i]))) return false;
  return true;
}

std::string name(DType dtype, int64_t n) {
  std::ostringstream out;
  out << dtype << " [" << n << "]";
  return out.str();
}

// Every collective of `group` (whose members are `members`, in group-rank order).
void check_collectives(ProcessGroup& group, const std::vector<int>& members) {
  const int me = group.rank(), size = group.size();
  const int world_rank = members[me];
  std::vector<int> group_ranks = members;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{13}, int64_t{1000}}) {
    for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool,
                        DType::Float16, DType::BFloat16}) {
      const std::string what = name(dtype, n);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
        if (dtype == DType::Bool && op != ReduceOp::Max && op != ReduceOp::Min) continue;
        if (op == ReduceOp::Avg && !is_floating(dtype) && !is_half_precision(dtype)) continue;
        // The inputs' sums are exact in every dtype; their products are not in the 16-bit
        // ones, which round along the way, in an order that is the algorithm's: to 1%.
        const double rtol = is_half_precision(dtype) && op == ReduceOp::Product ? 1e-2 : 1e-6;
        Tensor t = input(world_rank, n, dtype);
        group.all_reduce(t, op)->wait();
        if (!same(t, expected_reduction(group_ranks, n, dtype, op), rtol))
          fail("all_reduce " + std::string(reduce_op_name(op)) + " " + what);
        Tensor r = input(world_rank, n, dtype);
        const int root = size - 1;
        group.reduce(r, root, op)->wait();
        if (me == root ? !same(r, expected_reduction(group_ranks, n, dtype, op), rtol)
                       : !same(r, input(world_rank, n, dtype)))
          fail("reduce " + std::string(reduce_op_name(op)) + " " + what);
      }
      // broadcast from every root
      for (int root = 0; root < size; ++root) {
        Tensor b = input(world_rank, n, dtype);
        group.broadcast(b, root)->wait();
        if (!same(b, input(members[root], n, dtype))) fail("broadcast from " + std::to_string(root) + " " + what);
      }
      // all_gather, gather, scatter, all_to_all
      std::vector<Tensor> gathered;
      for (int r = 0; r < size; ++r) gathered.push_back(zeros({n}, on_device(dtype)));
      group.all_gather(gathered, input(world_rank, n, dtype))->wait();
      for (int r = 0; r < size; ++r)
        if (!same(gathered[r], input(members[r], n, dtype))) fail("all_gather " + what);
      const int root = 0;
      std::vector<Tensor> at_root;
      if (me == root)
        for (int r = 0; r < size; ++r) at_root.push_back(zeros({n}, on_device(dtype)));
      group.gather(at_root, input(world_rank, n, dtype), root)->wait();
      for (int r = 0; r < static_cast<int>(at_root.size()); ++r)
        if (!same(at_root[r], input(members[r], n, dtype))) fail("gather " + what);
      std::vector<Tensor> pieces;
      if (me == root)
        for (int r = 0; r < size; ++r) pieces.push_back(input(5 + r, n, dtype));
      Tensor mine = zeros({n}, on_device(dtype));
      group.scatter(mine, pieces, root)->wait();
      if (!same(mine, input(5 + me, n, dtype))) fail("scatter " + what);
      std::vector<Tensor> outs, ins;
      for (int r = 0; r < size; ++r) {
        outs.push_back(zeros({n}, on_device(dtype)));
        ins.push_back(input(10 * world_rank + members[r], n, dtype));
      }
      group.all_to_all(outs, ins)->wait();
      for (int r = 0; r < size; ++r)
        if (!same(outs[r], input(10 * members[r] + world_rank, n, dtype))) fail("all_to_all " + what);
      if (dtype != DType::Bool) {
        std::vector<Tensor> parts;
        for (int r = 0; r < size; ++r) parts.push_back(input(world_rank + r, n, dtype));
        Tensor result = zeros({n}, on_device(dtype));
        group.reduce_scatter(result, parts, ReduceOp::Sum)->wait();
        std::vector<int> shifted;
        for (int m : members) shifted.push_back(m + me);
        if (!same(result, expected_reduction(shifted, n, dtype, ReduceOp::Sum))) fail("reduce_scatter " + what);
      }
    }
  }
  // Non-contiguous tensors are staged and written back.
  Tensor wide = zeros({3, 8}, on_device());
  Tensor column = wide.narrow(1, 2, 1);
  column.copy_(full({3, 1}, static_cast<double>(world_rank + 1), on_device()));
  group.all_reduce(column)->wait();
  double total = 0;
  for (int m : members) total += m + 1;
  if (sum(wide).item() != 3 * total) fail("all_reduce of a non-contiguous view");
  // A ring of sends and receives, and queued work overlapping.
  if (size > 1) {
    Tensor out = full({5}, static_cast<double>(world_rank), on_device()), in = zeros({5}, on_device());
    auto s = group.send(out, (me + 1) % size, 3);
    auto r = group.recv(in, (me + size - 1) % size, 3);
    r->wait();
    s->wait();
    if (in.to_vector<float>()[4] != static_cast<float>(members[(me + size - 1) % size])) fail("send / recv ring");
  }
  std::vector<std::shared_ptr<Work>> queued;
  std::vector<Tensor> ts;
  for (int k = 0; k < 10; ++k) {
    ts.push_back(full({64}, static_cast<double>(k), on_device()));
    queued.push_back(group.all_reduce(ts.back()));
  }
  for (int k = 0; k < 10; ++k) {
    queued[k]->wait();
    if (ts[k].to_vector<float>()[0] != static_cast<float>(k * size)) fail("queued all_reduce " + std::to_string(k));
    if (!queued[k]->is_completed() || queued[k]->exception()) fail("queued work state " + std::to_string(k));
  }
  group.barrier()->wait();
}

int scenario_collectives() {
  InitOptions options;
  options.timeout = std::chrono::seconds(30);  // a bug fails the test, it does not hang it
  init_process_group(backend(), options);
  const int world = get_world_size();
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  check_collectives(default_group(), all);
  // A sub-group of the even ranks (every rank calls new_group; members get it).
  std::vector<int> even;
  for (int r = 0; r < world; r += 2) even.push_back(r);
  auto sub = new_group(even);
  if ((get_rank() % 2 == 0) != (sub != nullptr)) fail("new_group membership");
  if (sub) check_collectives(*sub, even);
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// weft's ring all-reduce against Gloo's, for every op, several dtypes and sizes (1 element,
// a prime, a size the world does not divide, several chunks per segment), and the ring as
// the group's all_reduce algorithm.
int scenario_ring() {
  InitOptions options;
  options.timeout = std::chrono::seconds(30);
  init_process_group(backend(), options);
  ProcessGroup& group = default_group();
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{11}, int64_t{1001}, int64_t{100003}}) {
    for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Float16, DType::BFloat16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
        if (op == ReduceOp::Avg && !is_floating(dtype) && !is_half_precision(dtype)) continue;
        for (int64_t chunk_bytes : {int64_t{1} << 20, int64_t{64}}) {
          if (chunk_bytes == 64 && n > 2000) continue;  // thousands of tiny messages: slow, no new case
          Tensor mine = input(get_rank(), n, dtype), theirs = input(get_rank(), n, dtype);
          ring_all_reduce(group, mine, op, RingOptions{chunk_bytes});
          group.all_reduce(theirs, op)->wait();
          // In 16 bits, products round at every step, and NCCL's avg multiplies each input by
          // 1/n before it sums (its PreMulSum), where the ring sums and then divides.
          const bool rounds = is_half_precision(dtype) && (op == ReduceOp::Product || op == ReduceOp::Avg);
          if (!same(mine, theirs, rounds ? 1e-2 : 1e-6))
            fail("ring_all_reduce " + std::string(reduce_op_name(op)) + " " + name(dtype, n) + " chunks of " +
                 std::to_string(chunk_bytes) + " bytes");
        }
      }
    }
  }
  auto ring = with_ring_all_reduce(std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
  Tensor t = full({3, 5}, static_cast<double>(get_rank() + 1), on_device());
  ring->all_reduce(t)->wait();
  const int w = get_world_size();
  if (t.to_vector<float>()[14] != static_cast<float>(w * (w + 1) / 2)) fail("with_ring_all_reduce");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// connect_peers (3 ranks or more): pairs outside the group refused on every rank before any
// message; a rank in no pair goes on at once; after the pairs are connected, a ring of
// messages through them arrives.
int scenario_connect_peers() {
  InitOptions options;
  options.timeout = std::chrono::seconds(30);
  init_process_group(backend(), options);
  ProcessGroup& group = default_group();
  const int rank = get_rank(), world = get_world_size();
  for (const auto& [a, b] : std::vector<std::pair<int, int>>{{1, 1}, {0, world}, {-1, 0}}) {
    const std::string expected = "connect_peers: the pair (" + std::to_string(a) + ", " + std::to_string(b) +
                                 ") is not two different ranks of the group of " + std::to_string(world);
    try {
      connect_peers(group, {{0, 1}, {a, b}}, device());
      fail("the pair (" + std::to_string(a) + ", " + std::to_string(b) + ") was accepted");
    } catch (const Error& e) {
      if (std::string(e.what()).find(expected) == std::string::npos) fail("unexpected error: " + std::string(e.what()));
    }
  }
  connect_peers(group, {{0, 1}}, device());  // the other ranks are in no pair
  std::vector<std::pair<int, int>> ring;
  for (int r = 0; r < world; ++r) ring.emplace_back((r + 1) % world, r);  // either order; repeats count once
  ring.emplace_back(0, 1);
  connect_peers(group, ring, device());
  Tensor mine = full({3}, static_cast<double>(rank + 1), on_device()), theirs = zeros({3}, on_device());
  const int next = (rank + 1) % world, previous = (rank + world - 1) % world;
  auto sent = group.send(mine, next);
  group.recv(theirs, previous)->wait();
  sent->wait();
  if (theirs.to_vector<float>() != std::vector<float>(3, static_cast<float>(previous + 1)))
    fail("the message from rank " + std::to_string(previous) + " after connect_peers");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Prints the rank and size init_process_group found (the env tests compare them).
int scenario_identity() {
  init_process_group(backend());
  Tensor t = full({1}, 1.0, on_device());
  default_group().all_reduce(t)->wait();
  std::cout << "identity: rank " << get_rank() << " size " << get_world_size() << " sum " << t.item() << std::endl;
  destroy_process_group();
  return 0;
}

// WEFT_DISTRIBUTED_DEBUG=1: rank 0 reduces 4 values, the others 5: every rank must fail
// with a message naming both calls.
int scenario_mismatch() {
  init_process_group(backend());
  Tensor t = zeros({get_rank() == 0 ? 4 : 5}, on_device());
  try {
    default_group().all_reduce(t)->wait();
    fail("a mismatched all_reduce went through");
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << std::endl;
  }
  destroy_process_group();  // rank 0 keeps serving the store until every rank has read the calls
  return failures == 0 ? 0 : 1;
}

// Rank 1 leaves right after joining; rank 0's next all_reduce must fail, not hang.
int scenario_dead_peer() {
  InitOptions options;
  options.timeout = std::chrono::seconds(3);
  init_process_group(backend(), options);
  // Every connection is up: an all-reduce of the size used below (NCCL may pick another
  // algorithm, and make other connections, for other sizes), then a barrier.
  Tensor warm = zeros({1000}, on_device());
  default_group().all_reduce(warm)->wait();
  default_group().barrier()->wait();
  if (get_rank() == 1) {
    std::cout << "rank 1 leaves" << std::endl;
    std::_Exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  try {
    Tensor t = zeros({1000}, on_device());
    default_group().all_reduce(t)->wait();
    if (backend() == "nccl") {
      // wait() ordered this rank's stream only: the host meets the failure when it waits
      // for the device (the watchdog aborts the communicator; by default it also ends the
      // process), and every later operation of the group throws.
      synchronize(device());
      default_group().barrier()->wait();
    }
    fail("an all_reduce with a dead peer succeeded");
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << std::endl;
  }
  std::_Exit(failures == 0 ? 0 : 1);
}

// A trace of a rank's collectives and messages, written to PATH.RANK for the test to read:
// an all-reduce of 4 MiB, then a message from rank 0 to rank 1 (with two ranks or more).
int scenario_trace(const std::string& path) {
  InitOptions options;
  options.timeout = std::chrono::seconds(30);
  init_process_group(backend(), options);
  trace::start();
  Tensor t = full({1 << 20}, 1.0, on_device());
  default_group().all_reduce(t)->wait();
  Tensor message = full({1024}, static_cast<double>(get_rank()), on_device());
  if (get_world_size() >= 2 && get_rank() == 0) default_group().send(message, 1, 7)->wait();
  if (get_world_size() >= 2 && get_rank() == 1) default_group().recv(message, 0, 7)->wait();
  synchronize(device());
  trace::write(path + "." + std::to_string(get_rank()));
  if (t.to(kCPU).to_vector<float>()[0] != static_cast<float>(get_world_size())) fail("trace: the all_reduce");
  default_group().barrier()->wait();
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

// Only some ranks of the world are started: the rendezvous must name the missing ones.
int scenario_missing() {
  InitOptions options;
  options.timeout = std::chrono::seconds(2);
  try {
    init_process_group(backend(), options);
    fail("init_process_group succeeded with ranks missing");
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << std::endl;
  }
  return failures == 0 ? 0 : 1;
}

// monitored_barrier: every rank passes the first; the ranks listed in ABSENT skip the second
// (sleeping past its timeout), and every rank that arrived prints the error it gets.
int scenario_monitored_barrier(const std::string& absent, bool wait_all_ranks) {
  InitOptions options;
  options.timeout = std::chrono::seconds(30);
  init_process_group(backend(), options);
  monitored_barrier(std::chrono::seconds(20));
  std::stringstream list(absent);
  std::string item;
  bool skips = false;
  while (std::getline(list, item, ',')) skips = skips || std::stoi(item) == get_rank();
  if (skips) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  } else {
    try {
      monitored_barrier(std::chrono::milliseconds(500), wait_all_ranks);
      fail("a monitored barrier with ranks missing passed");
    } catch (const Error& e) {
      std::cout << "error: " << e.what() << std::endl;
    }
  }
  destroy_process_group();  // rank 0 keeps serving the store until every rank has left
  return failures == 0 ? 0 : 1;
}


// A DeviceMesh's coordinates, groups and rank order, on meshes of 2 and 3 dimensions over the
// job (whose world is even): each group's all-reduce of the global ranks must sum its
// group_ranks, and a rank's rank in group(d) must be its coordinate along d.
int scenario_mesh() {
  init_process_group(backend());
  const int world = get_world_size(), rank = get_rank();
  const std::vector<std::vector<MeshDimension>> meshes{
      {{"pp", world / 2}, {"dp_replicate", 2}},
      {{"pp", 2}, {"dp_replicate", 1}, {"tp", world / 2}},
      {{"dp_replicate", world}}};
  for (const auto& dims : meshes) {
    DeviceMesh mesh(dims);
    std::vector<int> sizes;
    for (const MeshDimension& d : dims) sizes.push_back(d.size);
    // The digits of the rank in the mixed radix of the sizes, the last the fastest.
    std::vector<int> expected(dims.size());
    for (int r = rank, d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
      expected[d] = r % sizes[d];
      r /= sizes[d];
    }
    if (mesh.coordinates() != expected) fail(mesh.str() + ": coordinates differ from the mixed-radix digits");
    if (mesh.rank_at(mesh.coordinates()) != rank) fail(mesh.str() + ": rank_at(coordinates()) is not the rank");
    for (size_t d = 0; d < dims.size(); ++d) {
      const std::string& name = dims[d].name;
      ProcessGroup& group = *mesh.group(name);
      const std::vector<int> ranks = mesh.group_ranks(name);
      bool listed = false;
      for (const std::vector<int>& g : mesh_groups_along(sizes, d)) listed = listed || g == ranks;
      if (!listed) fail(mesh.str() + ": group_ranks('" + name + "') is not one of mesh_groups_along's");
      if (group.size() != dims[d].size || group.rank() != mesh.coordinate(name))
        fail(mesh.str() + ": group '" + name + "' has size " + std::to_string(group.size()) + " and rank " +
             std::to_string(group.rank()) + ", expected the dimension's size and this rank's coordinate");
      if (dims[d].size == world && mesh.group(name) != default_group_ptr())
        fail(mesh.str() + ": a dimension over the whole world is not the default group");
      Tensor t = full({1}, static_cast<double>(rank), on_device(DType::Float64));
      group.all_reduce(t, ReduceOp::Sum)->wait();
      double sum = 0;
      for (int r : ranks) sum += r;
      if (t.to(kCPU).item() != sum)
        fail(mesh.str() + ": the all-reduce along '" + name + "' summed " + std::to_string(t.to(kCPU).item()) +
             ", its ranks sum to " + std::to_string(sum));
    }
    std::cout << "ok: " << mesh.str() << std::endl;
  }
  // The plan's mesh: DDP's alone spans the world; a pipeline of the rest beside 2 replicas.
  const DeviceMesh ddp = build_mesh(ParallelPlan{});
  if (ddp.ndim() != 1 || ddp.group("dp_replicate") != default_group_ptr())
    fail("the default plan's mesh: " + ddp.str());
  const DeviceMesh piped = build_mesh(ParallelPlan{.pp = ParallelPlan::kRest, .dp_replicate = 2});
  if (piped.size("pp") != world / 2 || piped.coordinate("dp_replicate") != rank % 2)
    fail("the pipelined plan's mesh: " + piped.str());
  try {
    DeviceMesh wrong({{"pp", world + 1}});
    fail("a mesh of " + std::to_string(world + 1) + " ranks over " + std::to_string(world) + " was made");
  } catch (const Error& e) {
    const std::string expected = "make " + std::to_string(world + 1) + " ranks, but the job has " +
                                 std::to_string(world) + " ranks";
    if (std::string(e.what()).find(expected) == std::string::npos)
      fail("a mesh of the wrong size failed otherwise: " + std::string(e.what()));
  }
  // Replicas of one-rank pipelines span the job, but average over a group of their own; one
  // pipeline over the job is the default group.
  const pipeline::PipelineMesh replicas_only = pipeline::pipeline_mesh(world);
  if (replicas_only.replicas_group == nullptr || replicas_only.replicas_group == default_group_ptr() ||
      replicas_only.replicas_group->size() != world || replicas_only.pipeline->size() != 1)
    fail("pipeline_mesh(world): the replicas' group must be a group of the whole job other than the default one");
  const pipeline::PipelineMesh one_pipeline = pipeline::pipeline_mesh(1);
  if (one_pipeline.pipeline != default_group_ptr() || one_pipeline.replicas_group != nullptr)
    fail("pipeline_mesh(1): one pipeline over the job is the default group, with no replicas' group");
  destroy_process_group();
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  try {
    if (scenario == "collectives") return scenario_collectives();
    if (scenario == "identity") return scenario_identity();
    if (scenario == "ring") return scenario_ring();
    if (scenario == "connect_peers") return scenario_connect_peers();
    if (scenario == "mismatch") return scenario_mismatch();
    if (scenario == "dead_peer") return scenario_dead_peer();
    if (scenario == "missing") return scenario_missing();
    if (scenario == "mesh") return scenario_mesh();
    if (scenario == "trace" && argc > 2) return scenario_trace(argv[2]);
    if (scenario == "monitored_barrier" && argc > 2)
      return scenario_monitored_barrier(argv[2], argc > 3 && std::string(argv[3]) == "all");
  } catch (const std::exception& e) {
    std::cout << "FAIL: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << "process_group_worker: unknown scenario '" << scenario
            << "' (collectives, identity, ring, connect_peers, mismatch, dead_peer, missing, mesh, monitored_barrier, "
            << "trace)\n";
  return 2;
}
