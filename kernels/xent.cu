// xent.cu — row-wise softmax + cross-entropy over the logits (forward writes probs, which may
// alias the logits, and the per-row losses; backward turns probs into dlogits in place), rows
// ld elements apart (the padded vocabulary, ops.h logits_stride).
#include <limits.h>

#include "dtk.h"
#include "dtk_common.cuh"

#define XENT_THREADS 512

// A running softmax denominator: the largest logit m seen and sum of exp(x - m) over what was
// seen (m = -inf, s = 0: nothing yet, or only -inf logits).
struct XentMS {
    float m, s;
};
__device__ inline XentMS xent_ms_add(XentMS a, float v) {
    if (v > a.m) { // a new maximum: rescale what was summed (exp(-inf) = 0 when nothing was)
        a.s = a.s * expf(a.m - v) + 1.0f;
        a.m = v;
    } else if (v != -INFINITY) { // a NaN lands here and makes the sum, and the loss, NaN
        a.s += expf(v - a.m);
    }
    return a;
}
// commutative (the warp butterfly needs combine(a, b) and combine(b, a) to give the same bits:
// the explicit _rn operations keep nvcc from fusing one side's product into the sum, which
// would round the two orders differently).
// A side that saw only -inf and NaN has m = -inf: its s * exp(-inf) is 0, or NaN when it saw a
// NaN, which then reaches the loss, as the CPU's sum of exps carries it.
__device__ inline XentMS xent_ms_combine(XentMS a, XentMS b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return XentMS{m, a.s + b.s};
    return XentMS{m, __fadd_rn(__fmul_rn(a.s, expf(a.m - m)), __fmul_rn(b.s, expf(b.m - m)))};
}
// Over the whole block (blockDim.x a multiple of 32); every thread gets the same result.
__device__ inline XentMS xent_ms_block(XentMS v) {
    __shared__ XentMS part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int k = 16; k > 0; k >>= 1)
        v = xent_ms_combine(v, XentMS{__shfl_xor_sync(0xffffffffu, v.m, k), __shfl_xor_sync(0xffffffffu, v.s, k)});
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : XentMS{-INFINITY, 0.0f};
    for (int k = 16; k > 0; k >>= 1)
        v = xent_ms_combine(v, XentMS{__shfl_xor_sync(0xffffffffu, v.m, k), __shfl_xor_sync(0xffffffffu, v.s, k)});
    return v;
}

// What both kernels below store at column j of a row whose softmax has maximum mx and 1 / sum
// inv: p_j, or fused its gradient (p_j - onehot) * scale, rounded as xent_fwd stores p and
// xent_bwd reads it for float (no multiply-add across the two); for bf16 p stays float until the
// gradient is stored (p - 1 near p = 1 would lose everything in bf16). An ignored row's fused
// output (0) is written without this.
__device__ inline float xent_out(float xj, float mx, float inv, int j, int tg, float scale, int fused) {
    const float pj = __fmul_rn(expf(xj - mx), inv);
    return fused ? __fmul_rn(j == tg ? __fsub_rn(pj, 1.0f) : pj, scale) : pj;
}

// The row's loss, -log(exp(x_t - max) / sum) = log(sum) - (x_t - max), without rounding p_t
// first (0 for an ignored row), by thread 0.
__device__ inline void xent_loss(float *losses, XentMS ms, float xtg, int tg) {
    if (threadIdx.x == 0) losses[blockIdx.x] = tg >= 0 ? logf(ms.s) - (xtg - ms.m) : 0.0f;
}

// One block per row, two passes over it: the first finds the maximum and the sum of exp(x -
// max) at once (online softmax: a thread rescales its sum when its maximum grows), the second
// writes probs = exp(x - max) / sum, or, fused, the gradient. The first pass only reads and ends
// in a barrier, so every read of the row (x[target] included) is done before any thread
// writes, and in the second pass each thread reads x[j] just before overwriting the same j.
// fused: the second pass writes (p - onehot) * scale instead of p, computed as xent_bwd_kernel
// would from the same p (the same bits), and 0 on an ignored row. Rows are ld elements apart.
template <typename A>
static __device__ void xent(float *losses, void *out, const void *logits, const int *targets, float scale, int fused,
                            int V, int ld) {
    const size_t off = (size_t)blockIdx.x * ld;
    const A *x = (const A *)logits + off;
    A *p = (A *)out + off;
    const int tg = targets[blockIdx.x];
    const float xtg = tg >= 0 ? dtk_ld(x, tg) : 0.0f; // before the barrier below, so before any write

    XentMS ms = {-INFINITY, 0.0f};
    for (int j = threadIdx.x; j < V; j += blockDim.x) ms = xent_ms_add(ms, dtk_ld(x, j));
    ms = xent_ms_block(ms);
    xent_loss(losses, ms, xtg, tg);
    if (fused && tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) dtk_st(p, j, 0.0f);
        return;
    }
    const float inv = 1.0f / ms.s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) dtk_st(p, j, xent_out(dtk_ld(x, j), ms.m, inv, j, tg, scale, fused));
}
DTK_ACT_KERNELS(xent,
                (float *losses, void *out, const void *logits, const int *targets, float scale, int fused, int V, int ld),
                (losses, out, logits, targets, scale, fused, V, ld))

// The same for bf16 rows that start 16-byte aligned (ld % 8 == 0): each thread reads 8 logits
// (16 bytes) a load and writes 8 a store up to the last whole 8 of V, then one at a time; every
// element is computed as above (xent_ms_add, xent_out), only the order in which the threads'
// running sums are taken differs. The scalar kernel took 3.7 ms a call for GPT-2
// 124M's 16384 x 50257 on the H200, about three times what its bytes need.
static __global__ void dtk_xent_v8(float *losses, __nv_bfloat16 *out, const __nv_bfloat16 *logits, const int *targets,
                                   float scale, int fused, int V, int ld) {
    const size_t off = (size_t)blockIdx.x * ld;
    const __nv_bfloat16 *x = logits + off;
    __nv_bfloat16 *p = out + off;
    const int tg = targets[blockIdx.x], V8 = V / 8 * 8;
    const float xtg = tg >= 0 ? dtk_ld(x, tg) : 0.0f; // before the barrier below, so before any write

    XentMS ms = {-INFINITY, 0.0f};
    for (int j = threadIdx.x * 8; j < V8; j += blockDim.x * 8) {
        float f[8];
        dtk_ld8(x + j, f);
        for (int i = 0; i < 8; i++) ms = xent_ms_add(ms, f[i]);
    }
    for (int j = V8 + threadIdx.x; j < V; j += blockDim.x) ms = xent_ms_add(ms, dtk_ld(x, j));
    ms = xent_ms_block(ms);
    xent_loss(losses, ms, xtg, tg);
    const bool zero = fused && tg < 0;
    const float inv = 1.0f / ms.s;
    for (int j = threadIdx.x * 8; j < V8; j += blockDim.x * 8) {
        float f[8];
        if (!zero) dtk_ld8(x + j, f);
        for (int i = 0; i < 8; i++) f[i] = zero ? 0.0f : xent_out(f[i], ms.m, inv, j + i, tg, scale, fused);
        dtk_st8(p + j, f);
    }
    for (int j = V8 + threadIdx.x; j < V; j += blockDim.x)
        dtk_st(p, j, zero ? 0.0f : xent_out(dtk_ld(x, j), ms.m, inv, j, tg, scale, fused));
}
static inline bool xent_v8(dtk_type t, const void *a, const void *b, int ld) {
    return t == DTK_BF16 && ld % 8 == 0 && dtk_aligned16(a) && dtk_aligned16(b);
}

extern "C" cudaError_t dtk_xent_fwd(cudaStream_t s, dtk_type t, float *losses, void *probs, const void *logits,
                                    const int *targets, int N, int V, int ld) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (xent_v8(t, probs, logits, ld))
        dtk_xent_v8<<<N, XENT_THREADS, 0, s>>>(losses, (__nv_bfloat16 *)probs, (const __nv_bfloat16 *)logits, targets,
                                               1.0f, 0, V, ld);
    else if (t == DTK_BF16) dtk_xent_bf16<<<N, XENT_THREADS, 0, s>>>(losses, probs, logits, targets, 1.0f, 0, V, ld);
    else dtk_xent_f32<<<N, XENT_THREADS, 0, s>>>(losses, probs, logits, targets, 1.0f, 0, V, ld);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_xent_fused(cudaStream_t s, dtk_type t, float *losses, void *dlogits, const void *logits,
                                      const int *targets, float scale, int N, int V, int ld) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (xent_v8(t, dlogits, logits, ld))
        dtk_xent_v8<<<N, XENT_THREADS, 0, s>>>(losses, (__nv_bfloat16 *)dlogits, (const __nv_bfloat16 *)logits, targets,
                                               scale, 1, V, ld);
    else if (t == DTK_BF16) dtk_xent_bf16<<<N, XENT_THREADS, 0, s>>>(losses, dlogits, logits, targets, scale, 1, V, ld);
    else dtk_xent_f32<<<N, XENT_THREADS, 0, s>>>(losses, dlogits, logits, targets, scale, 1, V, ld);
    return cudaGetLastError();
}

// One block per row: d = (p - onehot(target)) * scale, or 0 for an ignored row. Each element
// depends only on p at the same position, so dlogits may alias probs.
template <typename A>
static __device__ void xent_bwd(void *dlogits, const void *probs, const int *targets, float scale, int V, int ld) {
    const size_t off = (size_t)blockIdx.x * ld;
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
DTK_ACT_KERNELS(xent_bwd, (void *dlogits, const void *probs, const int *targets, float scale, int V, int ld),
                (dlogits, probs, targets, scale, V, ld))

extern "C" cudaError_t dtk_xent_bwd(cudaStream_t s, dtk_type t, void *dlogits, const void *probs, const int *targets,
                                    float scale, int N, int V, int ld) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_xent_bwd_bf16<<<N, DTK_THREADS, 0, s>>>(dlogits, probs, targets, scale, V, ld);
    else dtk_xent_bwd_f32<<<N, DTK_THREADS, 0, s>>>(dlogits, probs, targets, scale, V, ld);
    return cudaGetLastError();
}

// A share of the rows (tensor parallelism), one block per row: the first maximum and its column
// (each thread its best of a strided slice, then the pairs reduced preferring the smaller column,
// as argmax.cu), then the sum of exp(x - max) in double.
template <typename A>
static __device__ void xent_part_stats(float *stats, const void *logits, const int *targets, int v0, int V, int ld) {
    const A *x = (const A *)logits + (size_t)blockIdx.x * ld;
    float best = -INFINITY;
    int arg = INT_MAX;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = dtk_ld(x, j);
        if (v > best || (v == best && j < arg)) {
            best = v;
            arg = j;
        }
    }
    __shared__ float sv[DTK_THREADS];
    __shared__ int si[DTK_THREADS];
    sv[threadIdx.x] = best;
    si[threadIdx.x] = arg;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            const float ov = sv[threadIdx.x + half];
            const int oi = si[threadIdx.x + half];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    // the CPU keeps column 0 while nothing compares greater than x[0]: a NaN there, or a row of
    // NaNs, gives column 0 (as argmax.cu)
    const float x0 = dtk_ld(x, 0);
    const int at = si[0] == INT_MAX || x0 != x0 ? 0 : si[0];
    const float mx = dtk_ld(x, at);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(dtk_ld(x, j) - mx);
    sum = dtk_block_reduce(sum, DtkSum(), 0.0);
    if (threadIdx.x == 0) {
        const int tg = targets[blockIdx.x], k = tg - v0;
        float *st = stats + (size_t)blockIdx.x * 4;
        st[0] = mx;
        st[1] = (float)sum;
        st[2] = tg >= 0 && k >= 0 && k < V ? dtk_ld(x, k) : 0.0f;
        st[3] = (float)(v0 + at);
    }
}
DTK_ACT_KERNELS(xent_part_stats, (float *stats, const void *logits, const int *targets, int v0, int V, int ld),
                (stats, logits, targets, v0, V, ld))

extern "C" cudaError_t dtk_xent_part_stats(cudaStream_t s, dtk_type t, float *stats, const void *logits,
                                           const int *targets, int v0, int N, int V, int ld) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_xent_part_stats_bf16<<<N, DTK_THREADS, 0, s>>>(stats, logits, targets, v0, V, ld);
    else dtk_xent_part_stats_f32<<<N, DTK_THREADS, 0, s>>>(stats, logits, targets, v0, V, ld);
    return cudaGetLastError();
}

// One block per row; each element from the logit at the same place, so dlogits may alias logits.
// (e * scale) - scale at the target, rounded as the CPU's two steps round it.
template <typename A>
static __device__ void xent_part_bwd(void *dlogits, const void *logits, const float *lse, const int *targets, int v0,
                                     float scale, int V, int ld) {
    const size_t off = (size_t)blockIdx.x * ld;
    const A *x = (const A *)logits + off;
    A *d = (A *)dlogits + off;
    const int tg = targets[blockIdx.x], k = tg - v0;
    const float l = lse[blockIdx.x];
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        if (tg < 0) {
            dtk_st(d, j, 0.0f);
            continue;
        }
        const float g = __fmul_rn(expf(dtk_ld(x, j) - l), scale);
        dtk_st(d, j, j == k ? __fsub_rn(g, scale) : g);
    }
}
DTK_ACT_KERNELS(xent_part_bwd,
                (void *dlogits, const void *logits, const float *lse, const int *targets, int v0, float scale, int V,
                 int ld),
                (dlogits, logits, lse, targets, v0, scale, V, ld))

extern "C" cudaError_t dtk_xent_part_bwd(cudaStream_t s, dtk_type t, void *dlogits, const void *logits, const float *lse,
                                         const int *targets, int v0, float scale, int N, int V, int ld) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_xent_part_bwd_bf16<<<N, DTK_THREADS, 0, s>>>(dlogits, logits, lse, targets, v0, scale, V, ld);
    else dtk_xent_part_bwd_f32<<<N, DTK_THREADS, 0, s>>>(dlogits, logits, lse, targets, v0, scale, V, ld);
    return cudaGetLastError();
}
