// xent.cu — row-wise softmax + cross-entropy over the logits (forward writes probs, which may
// alias the logits, and the per-row losses; backward turns probs into dlogits in place).
#include "dtk.h"
#include "dtk_common.cuh"

#define XENT_THREADS 512

// One block per row, three passes: max, sum of exp(x - max), then probs = exp(x - max) / sum
// (or, fused, the gradient) written element by element. The first two passes only read; the block reductions end in
// barriers, so every read of the row (x[target] included) is done before any thread writes
// probs, and in the last pass each thread reads x[j] just before overwriting the same j.
// fused: the last pass writes (p - onehot) * scale instead of p, computed as
// xent_bwd_kernel would from the same p (the same bits), and 0 on an ignored row.
template <typename A>
static __device__ void xent(float *losses, void *out, const void *logits, const int *targets, float scale, int fused,
                            int V) {
    const size_t off = (size_t)blockIdx.x * V;
    const A *x = (const A *)logits + off;
    A *p = (A *)out + off;
    const int tg = targets[blockIdx.x];

    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, dtk_ld(x, j));
    mx = dtk_block_reduce(mx, DtkMax(), -INFINITY);
    const float xt = tg >= 0 ? dtk_ld(x, tg) - mx : 0.0f;

    float sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(dtk_ld(x, j) - mx);
    sum = dtk_block_reduce(sum, DtkSum(), 0.0f);

    // loss = -log(exp(x_t - max) / sum) = log(sum) - (x_t - max), without rounding p_t first
    if (threadIdx.x == 0) losses[blockIdx.x] = tg >= 0 ? logf(sum) - xt : 0.0f;
    const float inv = 1.0f / sum;
    if (fused && tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) dtk_st(p, j, 0.0f);
        return;
    }
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        // rounded as xent_fwd stores p and xent_bwd reads it for float: no multiply-add across
        // the two; for bf16, p stays float until the gradient is stored (p - 1 near p = 1
        // would lose everything in bf16)
        const float pj = __fmul_rn(expf(dtk_ld(x, j) - mx), inv);
        dtk_st(p, j, fused ? __fmul_rn(j == tg ? __fsub_rn(pj, 1.0f) : pj, scale) : pj);
    }
}
DTK_ACT_KERNELS(xent, (float *losses, void *out, const void *logits, const int *targets, float scale, int fused, int V),
                (losses, out, logits, targets, scale, fused, V))

extern "C" cudaError_t dtk_xent_fwd(cudaStream_t s, dtk_type t, float *losses, void *probs, const void *logits,
                                    const int *targets, int N, int V) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) xent_bf16<<<N, XENT_THREADS, 0, s>>>(losses, probs, logits, targets, 1.0f, 0, V);
    else xent_f32<<<N, XENT_THREADS, 0, s>>>(losses, probs, logits, targets, 1.0f, 0, V);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_xent_fused(cudaStream_t s, dtk_type t, float *losses, void *dlogits, const void *logits,
                                      const int *targets, float scale, int N, int V) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) xent_bf16<<<N, XENT_THREADS, 0, s>>>(losses, dlogits, logits, targets, scale, 1, V);
    else xent_f32<<<N, XENT_THREADS, 0, s>>>(losses, dlogits, logits, targets, scale, 1, V);
    return cudaGetLastError();
}

// One block per row: d = (p - onehot(target)) * scale, or 0 for an ignored row. Each element
// depends only on p at the same position, so dlogits may alias probs.
template <typename A>
static __device__ void xent_bwd(void *dlogits, const void *probs, const int *targets, float scale, int V) {
    const size_t off = (size_t)blockIdx.x * V;
    const A *p = (const A *)probs + off;
    A *d = (A *)dlogits + off;
    const int tg = targets[blockIdx.x];
    if (tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) dtk_st(d, j, 0.0f);
        return;
    }
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float pj = dtk_ld(p, j);
        dtk_st(d, j, (j == tg ? pj - 1.0f : pj) * scale);
    }
}
DTK_ACT_KERNELS(xent_bwd, (void *dlogits, const void *probs, const int *targets, float scale, int V),
                (dlogits, probs, targets, scale, V))

extern "C" cudaError_t dtk_xent_bwd(cudaStream_t s, dtk_type t, void *dlogits, const void *probs, const int *targets,
                                    float scale, int N, int V) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) xent_bwd_bf16<<<N, DTK_THREADS, 0, s>>>(dlogits, probs, targets, scale, V);
    else xent_bwd_f32<<<N, DTK_THREADS, 0, s>>>(dlogits, probs, targets, scale, V);
    return cudaGetLastError();
}
