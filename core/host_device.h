// WEFT_HOST_DEVICE: marks a function that is compiled for the host and, under nvcc, for
// the GPU too.
//
// Some formulas must give the same bits on the CPU and on a GPU: a random fill from one
// generator state, a dropout mask, an optimizer step. Each such formula is written once,
// as a WEFT_HOST_DEVICE inline function that the CPU kernels (built by the host compiler)
// and the CUDA kernels (built by nvcc) both call, so that the two copies cannot drift
// apart. Under nvcc the macro is __host__ __device__; elsewhere it is empty, which keeps
// this header, and core/, free of CUDA.
#pragma once

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif
