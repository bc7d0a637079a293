// Library handles (cuBLAS, cuDNN) per (physical GPU, thread), lent from a process-wide pool
// (CUDA-only header).
//
// A handle belongs to the GPU that was current when it was created, and two threads must
// not use one handle at once. Creating one costs milliseconds (cuDNN's first far more),
// while parallel_apply and DataLoader threads come and go: so a thread's handles are not
// destroyed when the thread ends, its lease hands them back to the pool for the next
// thread. Neither the pool nor its handles are ever destroyed: at process exit the CUDA
// context may already be gone (destroying a handle then crashes), and the driver reclaims
// everything anyway.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"

namespace weft::cuda {

// Create() makes a new handle on the current GPU (throwing weft::Error on failure).
template <class Handle, Handle (*Create)()>
class HandlePool {
 public:
  // This thread's handle for physical GPU `gpu`.
  static Handle get(int gpu) {
    Lease& lease = thread_lease();
    const size_t slot = static_cast<size_t>(gpu);
    if (slot >= lease.handles.size()) lease.handles.resize(slot + 1, nullptr);
    if (lease.handles[slot] == nullptr) lease.handles[slot] = acquire(gpu);
    return lease.handles[slot];
  }

 private:
  struct Shared {
    std::mutex mutex;
    std::vector<std::vector<Handle>> free;  // per physical GPU
  };

  static Shared& shared() {
    static Shared* s = new Shared;  // never destroyed: leases end after static teardown starts
    return *s;
  }

  // The handles one thread holds, returned to the pool when the thread ends.
  struct Lease {
    std::vector<Handle> handles;  // per physical GPU; nullptr: none taken yet
    ~Lease() {
      Shared& s = shared();
      std::lock_guard lock(s.mutex);
      for (size_t gpu = 0; gpu < handles.size(); ++gpu) {
        if (handles[gpu] == nullptr) continue;
        if (s.free.size() <= gpu) s.free.resize(gpu + 1);
        s.free[gpu].push_back(handles[gpu]);
      }
    }
  };

  static Lease& thread_lease() {
    thread_local Lease lease;
    return lease;
  }

  static Handle acquire(int gpu) {
    Shared& s = shared();
    {
      std::lock_guard lock(s.mutex);
      const size_t slot = static_cast<size_t>(gpu);
      if (slot < s.free.size() && !s.free[slot].empty()) {
        Handle h = s.free[slot].back();
        s.free[slot].pop_back();
        return h;
      }
    }
    // Created on `gpu` whatever the caller's current device, which is restored after.
    int previous = 0;
    WEFT_CUDA_CHECK(cudaGetDevice(&previous));
    if (previous != gpu) WEFT_CUDA_CHECK(cudaSetDevice(gpu));
    Handle h = nullptr;
    try {
      h = Create();
    } catch (...) {
      if (previous != gpu) cudaSetDevice(previous);
      throw;
    }
    if (previous != gpu) WEFT_CUDA_CHECK(cudaSetDevice(previous));
    return h;
  }
};

}  // namespace weft::cuda
