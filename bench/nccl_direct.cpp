// ncclAllReduce called directly; see nccl_direct.h.
#include "nccl_direct.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace weft::bench {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(status));
}

template <class T>
int64_t fill_and_count_wrong(void* buffer, int64_t count, double value, double expected, cudaStream_t stream,
                             bool fill) {
  std::vector<T> host(static_cast<size_t>(count), static_cast<T>(value));
  if (fill) {
    check(cudaMemcpyAsync(buffer, host.data(), count * sizeof(T), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return 0;
  }
  check(cudaMemcpyAsync(host.data(), buffer, count * sizeof(T), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  int64_t wrong = 0;
  for (const T& v : host) wrong += static_cast<double>(v) != expected;
  return wrong;
}

}  // namespace

bool direct_nccl_built() { return true; }

struct DirectNccl::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buffer = nullptr;
  int rank = 0, size = 1, gpu = 0;
};

DirectNccl::DirectNccl(parallel::Store& store, int rank, int size, int gpu, int64_t max_bytes)
    : state_(std::make_unique<State>()) {
  state_->rank = rank;
  state_->size = size;
  state_->gpu = gpu;
  check(cudaSetDevice(gpu), "cudaSetDevice");
  ncclUniqueId id;
  const std::string key = "bench/direct_nccl_id";
  if (rank == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store.set(key, parallel::Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id));
  } else {
    parallel::Bytes bytes = store.get(key);
    if (bytes.size() != sizeof id) throw std::runtime_error("direct NCCL: a malformed id in the store");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  check(ncclCommInitRank(&state_->comm, size, id, rank), "ncclCommInitRank");
  check(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&state_->buffer, static_cast<size_t>(max_bytes)), "cudaMalloc");
}

DirectNccl::~DirectNccl() {
  cudaSetDevice(state_->gpu);
  if (state_->buffer) cudaFree(state_->buffer);
  if (state_->stream) cudaStreamDestroy(state_->stream);
  if (state_->comm) ncclCommDestroy(state_->comm);
}

DirectResult DirectNccl::all_reduce(int64_t count, DType dtype, int iters) {
  check(cudaSetDevice(state_->gpu), "cudaSetDevice");
  const bool f64 = dtype == DType::Float64;
  const ncclDataType_t type = f64 ? ncclFloat64 : ncclFloat32;
  auto reduce = [&] {
    check(ncclAllReduce(state_->buffer, state_->buffer, static_cast<size_t>(count), type, ncclSum, state_->comm,
                        state_->stream),
          "ncclAllReduce");
  };
  auto fill = [&](bool fill_it, double expected) {
    return f64 ? fill_and_count_wrong<double>(state_->buffer, count, state_->rank + 1, expected, state_->stream, fill_it)
               : fill_and_count_wrong<float>(state_->buffer, count, state_->rank + 1, expected, state_->stream, fill_it);
  };
  fill(true, 0);
  reduce();  // warm-up
  check(cudaStreamSynchronize(state_->stream), "cudaStreamSynchronize");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) reduce();
  check(cudaStreamSynchronize(state_->stream), "cudaStreamSynchronize");
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iters;
  fill(true, 0);
  reduce();
  const double n = state_->size;
  return {us, fill(false, n * (n + 1) / 2)};
}

}  // namespace weft::bench
