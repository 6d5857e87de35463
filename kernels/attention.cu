// attention.cu — the non-matmul parts of causal self-attention: the permutes between the
// (B,T,3C) / (B,T,C) activations and per-head (B,NH,T,hs) tensors, and the in-place causal
// softmax forward/backward over the (BH,T,T) score matrices (the matmuls are cuBLAS calls
// in src/ops/ops_cuda.c).
#include "dtk.h"
#include "dtk_common.cuh"

// All four permutes run one block per (b,t) row with threads over the columns c in [0,C):
// c = h*hs + j is element j of head h, at ((b*NH + h)*T + t)*hs + j in a per-head tensor.
static __device__ inline size_t head_index(int bt, int c, int T, int NH, int hs) {
    const int b = bt / T, t = bt - b * T, h = c / hs, j = c - h * hs;
    return ((size_t)(b * NH + h) * T + t) * hs + j;
}

// q, k, v (float) from columns c, C + c, 2C + c of qkv row bt (activations)
template <typename A>
static __device__ void qkv_split(float *q, float *k, float *v, const void *qkv, int T, int C, int NH) {
    const int bt = blockIdx.x, hs = C / NH;
    const A *row = (const A *)qkv + (size_t)bt * 3 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const size_t d = head_index(bt, c, T, NH, hs);
        q[d] = dtk_ld(row, c);
        k[d] = dtk_ld(row, C + c);
        v[d] = dtk_ld(row, 2 * C + c);
    }
}
DTK_ACT_KERNELS(qkv_split, (float *q, float *k, float *v, const void *qkv, int T, int C, int NH),
                (q, k, v, qkv, T, C, NH))

template <typename A>
static __device__ void qkv_merge(void *dqkv, const float *dq, const float *dk, const float *dv, int T, int C, int NH) {
    const int bt = blockIdx.x, hs = C / NH;
    A *row = (A *)dqkv + (size_t)bt * 3 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const size_t d = head_index(bt, c, T, NH, hs);
        dtk_st(row, c, dq[d]);
        dtk_st(row, C + c, dk[d]);
        dtk_st(row, 2 * C + c, dv[d]);
    }
}
DTK_ACT_KERNELS(qkv_merge, (void *dqkv, const float *dq, const float *dk, const float *dv, int T, int C, int NH),
                (dqkv, dq, dk, dv, T, C, NH))

// out[b,t,h*hs+j] = y[b,h,t,j]
template <typename A> static __device__ void heads_merge(void *out, const float *y, int T, int C, int NH) {
    const int bt = blockIdx.x, hs = C / NH;
    A *row = (A *)out + (size_t)bt * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dtk_st(row, c, y[head_index(bt, c, T, NH, hs)]);
}
DTK_ACT_KERNELS(heads_merge, (void *out, const float *y, int T, int C, int NH), (out, y, T, C, NH))

// dy[b,h,t,j] = dout[b,t,h*hs+j]
template <typename A> static __device__ void heads_split(float *dy, const void *dout, int T, int C, int NH) {
    const int bt = blockIdx.x, hs = C / NH;
    const A *row = (const A *)dout + (size_t)bt * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dy[head_index(bt, c, T, NH, hs)] = dtk_ld(row, c);
}
DTK_ACT_KERNELS(heads_split, (float *dy, const void *dout, int T, int C, int NH), (dy, dout, T, C, NH))

static bool bad_shape(int B, int T, int C, int NH) { return B <= 0 || T <= 0 || C <= 0 || NH <= 0; }

extern "C" cudaError_t dtk_qkv_split(cudaStream_t s, dtk_type t, float *q, float *k, float *v, const void *qkv, int B,
                                     int T, int C, int NH) {
    if (bad_shape(B, T, C, NH)) return cudaSuccess;
    if (t == DTK_BF16) dtk_qkv_split_bf16<<<B * T, DTK_THREADS, 0, s>>>(q, k, v, qkv, T, C, NH);
    else dtk_qkv_split_f32<<<B * T, DTK_THREADS, 0, s>>>(q, k, v, qkv, T, C, NH);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_qkv_merge(cudaStream_t s, dtk_type t, void *dqkv, const float *dq, const float *dk,
                                     const float *dv, int B, int T, int C, int NH) {
    if (bad_shape(B, T, C, NH)) return cudaSuccess;
    if (t == DTK_BF16) dtk_qkv_merge_bf16<<<B * T, DTK_THREADS, 0, s>>>(dqkv, dq, dk, dv, T, C, NH);
    else dtk_qkv_merge_f32<<<B * T, DTK_THREADS, 0, s>>>(dqkv, dq, dk, dv, T, C, NH);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_heads_merge(cudaStream_t s, dtk_type t, void *out, const float *y, int B, int T, int C,
                                       int NH) {
    if (bad_shape(B, T, C, NH)) return cudaSuccess;
    if (t == DTK_BF16) dtk_heads_merge_bf16<<<B * T, DTK_THREADS, 0, s>>>(out, y, T, C, NH);
    else dtk_heads_merge_f32<<<B * T, DTK_THREADS, 0, s>>>(out, y, T, C, NH);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_heads_split(cudaStream_t s, dtk_type t, float *dy, const void *dout, int B, int T, int C,
                                       int NH) {
    if (bad_shape(B, T, C, NH)) return cudaSuccess;
    if (t == DTK_BF16) dtk_heads_split_bf16<<<B * T, DTK_THREADS, 0, s>>>(dy, dout, T, C, NH);
    else dtk_heads_split_f32<<<B * T, DTK_THREADS, 0, s>>>(dy, dout, T, C, NH);
    return cudaGetLastError();
}

// One warp per row r of the BH*T rows; the row's query position is t = r % T, and only
// columns 0..t take part. Three passes over the row (max, sum, write) as in xent; each lane
// reads and writes only its own columns, so working in place is safe. The scaled score is
// rounded once (__fmul_rn: no fused multiply-add into the subtraction), so the max column
// gives exactly exp(0) = 1 and all passes see the same value.
static __global__ void dtk_causal_softmax_fwd_kernel(float *att, size_t rows, int T, float scale) {
    const size_t r = (size_t)blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int t = (int)(r % T);
    float *a = att + r * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, __fmul_rn(scale, a[j]));
    mx = dtk_warp_reduce(mx, DtkMax());
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += expf(__fmul_rn(scale, a[j]) - mx);
    const float inv = 1.0f / dtk_warp_reduce(sum, DtkSum());
    for (int j = lane; j < T; j += 32) a[j] = j <= t ? expf(__fmul_rn(scale, a[j]) - mx) * inv : 0.0f;
}

// datt_j = scale * att_j * (datt_j - sum_{i<=t} att_i datt_i) for j <= t, 0 above the diagonal
static __global__ void dtk_causal_softmax_bwd_kernel(float *datt, const float *att, size_t rows, int T, float scale) {
    const size_t r = (size_t)blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int t = (int)(r % T);
    const float *p = att + r * T;
    float *d = datt + r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += p[j] * d[j];
    dot = dtk_warp_reduce(dot, DtkSum());
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? scale * (p[j] * (d[j] - dot)) : 0.0f;
}

static unsigned softmax_blocks(size_t rows) { return (unsigned)((rows + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK); }

extern "C" cudaError_t dtk_causal_softmax_fwd(cudaStream_t s, float *att, int BH, int T, float scale) {
    if (BH <= 0 || T <= 0) return cudaSuccess;
    const size_t rows = (size_t)BH * T;
    dtk_causal_softmax_fwd_kernel<<<softmax_blocks(rows), DTK_THREADS, 0, s>>>(att, rows, T, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_causal_softmax_bwd(cudaStream_t s, float *datt, const float *att, int BH, int T,
                                              float scale) {
    if (BH <= 0 || T <= 0) return cudaSuccess;
    const size_t rows = (size_t)BH * T;
    dtk_causal_softmax_bwd_kernel<<<softmax_blocks(rows), DTK_THREADS, 0, s>>>(datt, att, rows, T, scale);
    return cudaGetLastError();
}

// ---- generation: attention of new rows over a key/value cache ----

// Block i copies new row i's key and value into cache row pos0 + i.
template <typename A> static __device__ void kv_append(void *kc_, void *vc_, const void *qkv, int pos0, int C) {
    const A *row = (const A *)qkv + (size_t)blockIdx.x * 3 * C;
    A *kc = (A *)kc_, *vc = (A *)vc_;
    const size_t dst = (size_t)(pos0 + blockIdx.x) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        kc[dst + c] = row[C + c];
        vc[dst + c] = row[2 * C + c];
    }
}
DTK_ACT_KERNELS(kv_append, (void *kc, void *vc, const void *qkv, int pos0, int C), (kc, vc, qkv, pos0, C))

// One block per (new row i, head h), at position t = pos0 + i: threads over the keys 0..t
// write the scores into p (the row's scratch), block reductions give the max and the sum of
// exp, then threads over the head's columns sum p[j] v[j] in increasing j (deterministic).
// The reductions end in barriers, so every p[j] is written before any thread reads it.
template <typename A>
static __device__ void attention_cached(void *out_, float *scratch, const void *kc_, const void *vc_,
                                        const void *qkv_, int pos0, int L, int C, int NH, float scale) {
    const A *kc = (const A *)kc_, *vc = (const A *)vc_, *qkv = (const A *)qkv_;
    const int i = blockIdx.x / NH, h = blockIdx.x - i * NH, hs = C / NH, t = pos0 + i;
    const A *q = qkv + (size_t)i * 3 * C + (size_t)h * hs;
    float *p = scratch + (size_t)blockIdx.x * L;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        const A *k = kc + (size_t)j * C + (size_t)h * hs;
        float d = 0.0f;
        for (int e = 0; e < hs; e++) d += dtk_ld(q, e) * dtk_ld(k, e);
        p[j] = d * scale;
        mx = fmaxf(mx, p[j]);
    }
    mx = dtk_block_reduce(mx, DtkMax(), -INFINITY);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    sum = dtk_block_reduce(sum, DtkSum(), 0.0f);
    const float inv = 1.0f / sum;
    for (int e = threadIdx.x; e < hs; e += blockDim.x) {
        const A *v = vc + (size_t)h * hs + e;
        float acc = 0.0f;
        for (int j = 0; j <= t; j++) acc += p[j] * dtk_ld(v, (size_t)j * C);
        dtk_st((A *)out_, (size_t)i * C + (size_t)h * hs + e, acc * inv);
    }
}
DTK_ACT_KERNELS(attention_cached,
                (void *out, float *scratch, const void *kc, const void *vc, const void *qkv, int pos0, int L, int C,
                 int NH, float scale),
                (out, scratch, kc, vc, qkv, pos0, L, C, NH, scale))

extern "C" cudaError_t dtk_attention_cached(cudaStream_t s, dtk_type t, void *out, void *kcache, void *vcache,
                                            float *scratch, const void *qkv, int pos0, int n, int C, int NH) {
    if (n <= 0 || C <= 0 || NH <= 0 || pos0 < 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_kv_append_bf16<<<n, DTK_THREADS, 0, s>>>(kcache, vcache, qkv, pos0, C);
    else dtk_kv_append_f32<<<n, DTK_THREADS, 0, s>>>(kcache, vcache, qkv, pos0, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const float scale = 1.0f / sqrtf((float)(C / NH));
    if (t == DTK_BF16)
        dtk_attention_cached_bf16<<<n * NH, DTK_THREADS, 0, s>>>(out, scratch, kcache, vcache, qkv, pos0, pos0 + n, C, NH, scale);
    else dtk_attention_cached_f32<<<n * NH, DTK_THREADS, 0, s>>>(out, scratch, kcache, vcache, qkv, pos0, pos0 + n, C, NH, scale);
    return cudaGetLastError();
}
