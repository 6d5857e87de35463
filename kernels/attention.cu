// attention.cu — the non-matmul parts of causal self-attention (grouped-query: NKV key/value
// heads for NH query heads): the permutes between the (B,T,(NH+2NKV)hs) / (B,T,NH*hs)
// activations and per-head (B,heads,T,hs) tensors, and the in-place causal
// softmax forward/backward over the (BH,T,T) score matrices (the matmuls are cuBLAS calls
// in src/ops/ops_cuda.c); packed rows' mask for cuDNN's fused attention; attention over a
// key/value cache (generation).
#include "dtk.h"
#include "dtk_common.cuh"

// All four permutes run one block per (b,t) row with threads over its columns. A qkv row is
// [q (NH*hs) | k (NKV*hs) | v (NKV*hs)]; column j of head h of a part with `heads` heads goes
// to ((b*heads + h)*T + t)*hs + j of that part's per-head tensor (q: NH heads, k and v: NKV).
// An out or dout row is NH*hs wide, head h at h*hs.
static __device__ inline size_t head_index(int bt, int h, int j, int T, int heads, int hs) {
    const int b = bt / T, t = bt - b * T;
    return ((size_t)(b * heads + h) * T + t) * hs + j;
}

// the per-head tensor (0 q, 1 k, 2 v), its head and the column in the head of qkv column c
struct QkvCol {
    int part, h, j;
};
static __device__ inline QkvCol qkv_col(int c, const dtk_att_shape &a) {
    const int q = a.NH * a.hs, kv = a.NKV * a.hs;
    const int part = c < q ? 0 : c < q + kv ? 1 : 2, c0 = part == 0 ? 0 : part == 1 ? q : q + kv;
    return {part, (c - c0) / a.hs, (c - c0) % a.hs};
}

static __device__ inline int qkv_width(const dtk_att_shape &a) { return (a.NH + 2 * a.NKV) * a.hs; }

// q, k, v (float) from the columns of qkv row bt (activations)
template <typename A> static __device__ void qkv_split(float *q, float *k, float *v, const void *qkv, dtk_att_shape a) {
    const int bt = blockIdx.x, W = qkv_width(a);
    const A *row = (const A *)qkv + (size_t)bt * W;
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        const QkvCol x = qkv_col(c, a);
        (x.part == 0 ? q : x.part == 1 ? k : v)[head_index(bt, x.h, x.j, a.T, x.part ? a.NKV : a.NH, a.hs)] = dtk_ld(row, c);
    }
}
DTK_ACT_KERNELS(qkv_split, (float *q, float *k, float *v, const void *qkv, dtk_att_shape a), (q, k, v, qkv, a))

template <typename A>
static __device__ void qkv_merge(void *dqkv, const float *dq, const float *dk, const float *dv, dtk_att_shape a) {
    const int bt = blockIdx.x, W = qkv_width(a);
    A *row = (A *)dqkv + (size_t)bt * W;
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        const QkvCol x = qkv_col(c, a);
        const float *src = x.part == 0 ? dq : x.part == 1 ? dk : dv;
        dtk_st(row, c, src[head_index(bt, x.h, x.j, a.T, x.part ? a.NKV : a.NH, a.hs)]);
    }
}
DTK_ACT_KERNELS(qkv_merge, (void *dqkv, const float *dq, const float *dk, const float *dv, dtk_att_shape a),
                (dqkv, dq, dk, dv, a))

// out[b,t,h*hs+j] = y[b,h,t,j]
template <typename A> static __device__ void heads_merge(void *out, const float *y, dtk_att_shape a) {
    const int bt = blockIdx.x, HQ = a.NH * a.hs;
    A *row = (A *)out + (size_t)bt * HQ;
    for (int c = threadIdx.x; c < HQ; c += blockDim.x) dtk_st(row, c, y[head_index(bt, c / a.hs, c % a.hs, a.T, a.NH, a.hs)]);
}
DTK_ACT_KERNELS(heads_merge, (void *out, const float *y, dtk_att_shape a), (out, y, a))

// dy[b,h,t,j] = dout[b,t,h*hs+j]
template <typename A> static __device__ void heads_split(float *dy, const void *dout, dtk_att_shape a) {
    const int bt = blockIdx.x, HQ = a.NH * a.hs;
    const A *row = (const A *)dout + (size_t)bt * HQ;
    for (int c = threadIdx.x; c < HQ; c += blockDim.x) dy[head_index(bt, c / a.hs, c % a.hs, a.T, a.NH, a.hs)] = dtk_ld(row, c);
}
DTK_ACT_KERNELS(heads_split, (float *dy, const void *dout, dtk_att_shape a), (dy, dout, a))

static bool bad_shape(const dtk_att_shape &a) {
    return a.B <= 0 || a.T <= 0 || a.NH <= 0 || a.NKV <= 0 || a.hs <= 0 || a.NH % a.NKV != 0;
}

extern "C" cudaError_t dtk_qkv_split(cudaStream_t s, dtk_type t, float *q, float *k, float *v, const void *qkv,
                                     dtk_att_shape a) {
    if (bad_shape(a)) return cudaSuccess;
    if (t == DTK_BF16) dtk_qkv_split_bf16<<<a.B * a.T, DTK_THREADS, 0, s>>>(q, k, v, qkv, a);
    else dtk_qkv_split_f32<<<a.B * a.T, DTK_THREADS, 0, s>>>(q, k, v, qkv, a);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_qkv_merge(cudaStream_t s, dtk_type t, void *dqkv, const float *dq, const float *dk,
                                     const float *dv, dtk_att_shape a) {
    if (bad_shape(a)) return cudaSuccess;
    if (t == DTK_BF16) dtk_qkv_merge_bf16<<<a.B * a.T, DTK_THREADS, 0, s>>>(dqkv, dq, dk, dv, a);
    else dtk_qkv_merge_f32<<<a.B * a.T, DTK_THREADS, 0, s>>>(dqkv, dq, dk, dv, a);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_heads_merge(cudaStream_t s, dtk_type t, void *out, const float *y, dtk_att_shape a) {
    if (bad_shape(a)) return cudaSuccess;
    if (t == DTK_BF16) dtk_heads_merge_bf16<<<a.B * a.T, DTK_THREADS, 0, s>>>(out, y, a);
    else dtk_heads_merge_f32<<<a.B * a.T, DTK_THREADS, 0, s>>>(out, y, a);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_heads_split(cudaStream_t s, dtk_type t, float *dy, const void *dout, dtk_att_shape a) {
    if (bad_shape(a)) return cudaSuccess;
    if (t == DTK_BF16) dtk_heads_split_bf16<<<a.B * a.T, DTK_THREADS, 0, s>>>(dy, dout, a);
    else dtk_heads_split_f32<<<a.B * a.T, DTK_THREADS, 0, s>>>(dy, dout, a);
    return cudaGetLastError();
}

// One warp per row r of the BH*T rows; the row's query position is t = r % T, and only
// columns 0..t take part. Three passes over the row (max, sum, write) as in xent; each lane
// reads and writes only its own columns, so working in place is safe. The scaled score is
// rounded once (__fmul_rn: no fused multiply-add into the subtraction), so the max column
// gives exactly exp(0) = 1 and all passes see the same value.
// The first column row r of att(B*NH,T,T) reads: 0, or with packed rows its example's first row.
static __device__ int softmax_lo(size_t r, int t, dtk_att_shape a) {
    return a.pos ? t - a.pos[(r / a.T) / a.NH * a.T + t] : 0;
}

static __global__ void dtk_causal_softmax_fwd_kernel(float *att, size_t rows, dtk_att_shape sh, float scale) {
    const size_t r = (size_t)blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, T = sh.T;
    if (r >= rows) return;
    const int t = (int)(r % T), lo = softmax_lo(r, t, sh);
    float *a = att + r * T;
    float mx = -INFINITY;
    for (int j = lo + lane; j <= t; j += 32) mx = fmaxf(mx, __fmul_rn(scale, a[j]));
    mx = dtk_warp_reduce(mx, DtkMax());
    float sum = 0.0f;
    for (int j = lo + lane; j <= t; j += 32) sum += expf(__fmul_rn(scale, a[j]) - mx);
    const float inv = 1.0f / dtk_warp_reduce(sum, DtkSum());
    for (int j = lane; j < T; j += 32) a[j] = j >= lo && j <= t ? expf(__fmul_rn(scale, a[j]) - mx) * inv : 0.0f;
}

// datt_j = scale * att_j * (datt_j - sum_{lo<=i<=t} att_i datt_i) for lo <= j <= t, 0 elsewhere
static __global__ void dtk_causal_softmax_bwd_kernel(float *datt, const float *att, size_t rows, dtk_att_shape sh,
                                                     float scale) {
    const size_t r = (size_t)blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, T = sh.T;
    if (r >= rows) return;
    const int t = (int)(r % T), lo = softmax_lo(r, t, sh);
    const float *p = att + r * T;
    float *d = datt + r * T;
    float dot = 0.0f;
    for (int j = lo + lane; j <= t; j += 32) dot += p[j] * d[j];
    dot = dtk_warp_reduce(dot, DtkSum());
    for (int j = lane; j < T; j += 32) d[j] = j >= lo && j <= t ? scale * (p[j] * (d[j] - dot)) : 0.0f;
}

static unsigned softmax_blocks(size_t rows) { return (unsigned)((rows + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK); }

extern "C" cudaError_t dtk_causal_softmax_fwd(cudaStream_t s, float *att, dtk_att_shape a, float scale) {
    if (a.B <= 0 || a.NH <= 0 || a.T <= 0) return cudaSuccess;
    const size_t rows = (size_t)a.B * a.NH * a.T;
    dtk_causal_softmax_fwd_kernel<<<softmax_blocks(rows), DTK_THREADS, 0, s>>>(att, rows, a, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_causal_softmax_bwd(cudaStream_t s, float *datt, const float *att, dtk_att_shape a,
                                              float scale) {
    if (a.B <= 0 || a.NH <= 0 || a.T <= 0) return cudaSuccess;
    const size_t rows = (size_t)a.B * a.NH * a.T;
    dtk_causal_softmax_bwd_kernel<<<softmax_blocks(rows), DTK_THREADS, 0, s>>>(datt, att, rows, a, scale);
    return cudaGetLastError();
}

// ---- packed rows' mask for cuDNN's fused attention ----

// One block per row r = b*T + t of the (B,T,T) mask (rows ld apart), threads over its T columns.
static __global__ void dtk_att_example_mask_kernel(dtk_bf16 *mask, int ld, dtk_att_shape a) {
    const size_t r = blockIdx.x;
    const int t = (int)(r % (size_t)a.T), lo = t - a.pos[r];
    const float masked = DTK_ATT_MASKED;
    for (int j = threadIdx.x; j < a.T; j += blockDim.x) dtk_st(mask, r * ld + j, j >= lo && j <= t ? 0.0f : masked);
}

extern "C" cudaError_t dtk_att_example_mask(cudaStream_t s, dtk_bf16 *mask, int ld, dtk_att_shape a) {
    if (!a.pos || a.B <= 0 || a.T <= 0) return cudaSuccess;
    if (ld < a.T) return cudaErrorInvalidValue;
    dtk_att_example_mask_kernel<<<(unsigned)((size_t)a.B * a.T), DTK_THREADS, 0, s>>>(mask, ld, a);
    return cudaGetLastError();
}

// ---- generation: attention of new rows over a key/value cache ----

// Block i copies new row i's keys and values (NKV*hs columns each) into cache row pos0 + i.
template <typename A> static __device__ void kv_append(void *kc_, void *vc_, const void *qkv, int pos0, dtk_att_shape a) {
    const int KV = a.NKV * a.hs, koff = a.NH * a.hs;
    const A *row = (const A *)qkv + (size_t)blockIdx.x * qkv_width(a);
    A *kc = (A *)kc_, *vc = (A *)vc_;
    const size_t dst = (size_t)(pos0 + blockIdx.x) * KV;
    for (int c = threadIdx.x; c < KV; c += blockDim.x) {
        kc[dst + c] = row[koff + c];
        vc[dst + c] = row[koff + KV + c];
    }
}
DTK_ACT_KERNELS(kv_append, (void *kc, void *vc, const void *qkv, int pos0, dtk_att_shape a), (kc, vc, qkv, pos0, a))

// One block per (new row i, query head h), at position t = pos0 + i, over key/value head
// g = h / (NH/NKV) of the cache (rows NKV*hs wide): threads over the keys 0..t write the scores
// into p (the row's scratch), block reductions give the max and the sum of exp, then threads
// over the head's columns sum p[j] v[j] in increasing j (deterministic). The reductions end in
// barriers, so every p[j] is written before any thread reads it.
template <typename A>
static __device__ void attention_cached(void *out_, float *scratch, const void *kc_, const void *vc_,
                                        const void *qkv_, int pos0, int L, dtk_att_shape a, float scale) {
    const A *kc = (const A *)kc_, *vc = (const A *)vc_, *qkv = (const A *)qkv_;
    const int i = blockIdx.x / a.NH, h = blockIdx.x - i * a.NH, hs = a.hs, t = pos0 + i;
    const int g = h / (a.NH / a.NKV), KV = a.NKV * hs;
    const A *q = qkv + (size_t)i * qkv_width(a) + (size_t)h * hs;
    float *p = scratch + (size_t)blockIdx.x * L;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        const A *k = kc + (size_t)j * KV + (size_t)g * hs;
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
        const A *v = vc + (size_t)g * hs + e;
        float acc = 0.0f;
        for (int j = 0; j <= t; j++) acc += p[j] * dtk_ld(v, (size_t)j * KV);
        dtk_st((A *)out_, (size_t)i * a.NH * hs + (size_t)h * hs + e, acc * inv);
    }
}
DTK_ACT_KERNELS(attention_cached,
                (void *out, float *scratch, const void *kc, const void *vc, const void *qkv, int pos0, int L,
                 dtk_att_shape a, float scale),
                (out, scratch, kc, vc, qkv, pos0, L, a, scale))

extern "C" cudaError_t dtk_attention_cached(cudaStream_t s, dtk_type t, void *out, void *kcache, void *vcache,
                                            float *scratch, const void *qkv, int pos0, dtk_att_shape a) {
    const int n = a.T;
    if (n <= 0 || bad_shape(a) || pos0 < 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_kv_append_bf16<<<n, DTK_THREADS, 0, s>>>(kcache, vcache, qkv, pos0, a);
    else dtk_kv_append_f32<<<n, DTK_THREADS, 0, s>>>(kcache, vcache, qkv, pos0, a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const float scale = 1.0f / sqrtf((float)a.hs);
    if (t == DTK_BF16)
        dtk_attention_cached_bf16<<<n * a.NH, DTK_THREADS, 0, s>>>(out, scratch, kcache, vcache, qkv, pos0, pos0 + n, a, scale);
    else dtk_attention_cached_f32<<<n * a.NH, DTK_THREADS, 0, s>>>(out, scratch, kcache, vcache, qkv, pos0, pos0 + n, a, scale);
    return cudaGetLastError();
}
