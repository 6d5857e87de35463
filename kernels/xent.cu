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
static __global__ void xent_kernel(float *losses, float *out, const float *logits, const int *targets, float scale,
                                   int fused, int V) {
    const size_t off = (size_t)blockIdx.x * V;
    const float *x = logits + off;
    float *p = out + off;
    const int tg = targets[blockIdx.x];

    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = dtk_block_reduce(mx, DtkMax(), -INFINITY);
    const float xt = tg >= 0 ? x[tg] - mx : 0.0f;

    float sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - mx);
    sum = dtk_block_reduce(sum, DtkSum(), 0.0f);

    // loss = -log(exp(x_t - max) / sum) = log(sum) - (x_t - max), without rounding p_t first
    if (threadIdx.x == 0) losses[blockIdx.x] = tg >= 0 ? logf(sum) - xt : 0.0f;
    const float inv = 1.0f / sum;
    if (fused && tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] = 0.0f;
        return;
    }
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        // rounded as xent_fwd stores p and xent_bwd reads it: no multiply-add across the two
        const float pj = __fmul_rn(expf(x[j] - mx), inv);
        p[j] = fused ? __fmul_rn(j == tg ? __fsub_rn(pj, 1.0f) : pj, scale) : pj;
    }
}

extern "C" cudaError_t dtk_xent_fwd(cudaStream_t s, float *losses, float *probs, const float *logits,
                                    const int *targets, int N, int V) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    xent_kernel<<<N, XENT_THREADS, 0, s>>>(losses, probs, logits, targets, 1.0f, 0, V);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_xent_fused(cudaStream_t s, float *losses, float *dlogits, const float *logits,
                                      const int *targets, float scale, int N, int V) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    xent_kernel<<<N, XENT_THREADS, 0, s>>>(losses, dlogits, logits, targets, scale, 1, V);
    return cudaGetLastError();
}

// One block per row: d = (p - onehot(target)) * scale, or 0 for an ignored row. Each element
// depends only on p at the same position, so dlogits may alias probs.
static __global__ void xent_bwd_kernel(float *dlogits, const float *probs, const int *targets, float scale, int V) {
    const size_t off = (size_t)blockIdx.x * V;
    const float *p = probs + off;
    float *d = dlogits + off;
    const int tg = targets[blockIdx.x];
    if (tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0.0f;
        return;
    }
    for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = (j == tg ? p[j] - 1.0f : p[j]) * scale;
}

extern "C" cudaError_t dtk_xent_bwd(cudaStream_t s, float *dlogits, const float *probs, const int *targets, float scale,
                                    int N, int V) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    xent_bwd_kernel<<<N, DTK_THREADS, 0, s>>>(dlogits, probs, targets, scale, V);
    return cudaGetLastError();
}
