// Teaching ladder for the attention forward in float32,
//
//   out = softmax(q k^T * scale + mask) v      per (batch, head),
//
// from three naive kernels to one fused FlashAttention-style kernel. q is [BH, L, E], k and
// v are [BH, S, E], out is [BH, L, E], all contiguous (BH = batch * heads: heads are
// independent problems). With `causal`, key j is masked for query i when j > i (top-left
// aligned, as PyTorch's is_causal; key 0 is never masked, so no row is empty).
//
// Attention does 4 L S E flops per head (two products) on 4 (L + 2S + L) E bytes of input
// and output, so at L = S = 1024, E = 64 it does ~128 flops per byte it must move: it is
// compute-bound, unless the L x S scores go through memory. Each rung removes what keeps
// the previous one from being so:
//
//   1 naive          three kernels: S = q k^T * scale written to global memory (one thread
//                    per score), a softmax over each row (one thread per row, three passes),
//                    then P v (one thread per output). The L x S matrix is written twice and
//                    read four times, the softmax's passes by threads whose reads are S floats
//                    apart (uncoalesced).
//   2 fused_softmax  the same two products, but the softmax is one kernel with a warp per row:
//                    one coalesced pass finds the maximum and the sum of exponentials together
//                    (online softmax), a second writes P: a quarter less softmax traffic, and
//                    all of it coalesced. The products are rung 1's; the L x S matrix still
//                    goes through memory five times.
//   3 flash          one kernel, a block per (head, 64-query tile): K and V tiles are staged
//                    in shared memory, each thread keeps a 4 x 4 patch of scores, the running
//                    row maxima and sums and a rescaled output accumulator in registers, and
//                    the L x S matrix never exists. Causal blocks stop at the diagonal, so
//                    they do half the work, and start longest first.
//
// Rungs 1 and 2 need `workspace`: attention_workspace_floats() floats for the scores. Rung 3
// takes E <= 128 (its accumulator lives in registers, sized at compile time) and up to
// 116.5 KiB of shared memory per block; its launcher throws weft::Error otherwise. Every
// launcher runs on `stream`, never synchronises, and checks its launches. attention.cu also
// holds a reference made of cuBLAS products around rung 2's softmax (the composed "math"
// path at its fastest), and, unless WEFT_DEV_NO_MAIN, the CPU reference, validation and
// timing table; bench/attention times these rungs beside weft's scaled_dot_product_attention.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::dev {

struct AttentionShape {
  int bh = 1;  // batch * heads
  int L = 1;   // queries per head
  int S = 1;   // keys (and values) per head
  int E = 1;   // head dimension of q, k and v
  bool causal = false;
  float scale = 1.f;  // usually 1 / sqrt(E)
};

// Floats of score workspace that rungs 1, 2 and attention_cublas_math need (0 for rung 3).
int64_t attention_workspace_floats(const AttentionShape& shape);

void attention_naive(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                     float* workspace, cudaStream_t stream);
void attention_fused_softmax(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                             float* workspace, cudaStream_t stream);
void attention_flash(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                     float* workspace, cudaStream_t stream);

// Whether attention_flash takes this shape on the current device; otherwise `reason` says why.
bool attention_flash_supports(const AttentionShape& shape, const char** reason);

// The reference: the scores and P v by cublasSgemmStridedBatched (float32, no TF32: `handle`
// must be in CUBLAS_DEFAULT_MATH and bound to `stream`) around rung 2's softmax kernel.
void attention_cublas_math(cublasHandle_t handle, const AttentionShape& shape, const float* q, const float* k,
                           const float* v, float* out, float* workspace, cudaStream_t stream);

// The rungs by number, for tables and command lines.
using AttentionLauncher = void (*)(const AttentionShape&, const float*, const float*, const float*, float*, float*,
                                   cudaStream_t);
struct AttentionVariant {
  int number;
  const char* name;
  AttentionLauncher launch;
};
inline constexpr AttentionVariant kAttentionVariants[] = {
    {1, "naive", &attention_naive},
    {2, "fused_softmax", &attention_fused_softmax},
    {3, "flash", &attention_flash},
};

}  // namespace weft::dev
