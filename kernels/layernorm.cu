// layernorm.cu — LayerNorm forward and backward (eps 1e-5, biased variance), RMSNorm forward
// and backward (the Llama family's), plus the column reductions their weight gradients and the
// products' bias gradients share: one kernel each, row chunks summed in double, finished by the
// last block of each column tile in a fixed order.
#include "dtk.h"
#include "dtk_common.cuh"

#define LN_EPS 1e-5f

// One warp per row, lanes strided over the columns; two passes (mean, then the variance of
// x - mean, as the CPU computes it).
template <typename A>
static __device__ void layernorm_fwd(void *out_, float *mean, float *rstd, const void *inp, const float *w,
                                     const float *b, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const A *x = (const A *)inp + (size_t)row * C;
    // sums in double, as the CPU: a float sum of C values loses the mean's low bits when
    // |mean| >> std, and every (x - m) inherits that error
    double s = 0.0;
    for (int c = lane; c < C; c += 32) s += dtk_ld(x, c);
    const float m = (float)(dtk_warp_reduce(s, DtkSum()) / C);
    double v = 0.0;
    for (int c = lane; c < C; c += 32) {
        const float d = dtk_ld(x, c) - m;
        v += (double)d * d;
    }
    const float r = 1.0f / sqrtf((float)(dtk_warp_reduce(v, DtkSum()) / C) + LN_EPS);
    A *o = (A *)out_ + (size_t)row * C;
    for (int c = lane; c < C; c += 32) dtk_st(o, c, (dtk_ld(x, c) - m) * r * w[c] + b[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}
DTK_ACT_KERNELS(layernorm_fwd,
                (void *out, float *mean, float *rstd, const void *inp, const float *w, const float *b, int N, int C),
                (out, mean, rstd, inp, w, b, N, C))

// The same for bf16 rows of C % 8 == 0 elements, 16-byte aligned, 8 elements a load (as
// dtk_layernorm_bwd_dinp_v8); the sums in double, in each lane's order of its elements
static __global__ void dtk_layernorm_fwd_v8(__nv_bfloat16 *out, float *mean, float *rstd, const __nv_bfloat16 *inp,
                                            const float *w, const float *b, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const __nv_bfloat16 *x = inp + (size_t)row * C;
    double s = 0.0;
    for (int c = lane * 8; c < C; c += 256) {
        float f[8];
        dtk_ld8(x + c, f);
        for (int i = 0; i < 8; i++) s += f[i];
    }
    const float m = (float)(dtk_warp_reduce(s, DtkSum()) / C);
    double v = 0.0;
    for (int c = lane * 8; c < C; c += 256) {
        float f[8];
        dtk_ld8(x + c, f);
        for (int i = 0; i < 8; i++) {
            const float d = f[i] - m;
            v += (double)d * d;
        }
    }
    const float r = 1.0f / sqrtf((float)(dtk_warp_reduce(v, DtkSum()) / C) + LN_EPS);
    __nv_bfloat16 *o = out + (size_t)row * C;
    for (int c = lane * 8; c < C; c += 256) {
        float f[8];
        dtk_ld8(x + c, f);
        for (int i = 0; i < 8; i++) f[i] = (f[i] - m) * r * w[c + i] + b[c + i];
        dtk_st8(o + c, f);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" cudaError_t dtk_layernorm_fwd(cudaStream_t s, dtk_type t, void *out, float *mean, float *rstd,
                                         const void *inp, const float *w, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    if (t == DTK_BF16 && C % 8 == 0 && dtk_aligned16(out) && dtk_aligned16(inp))
        dtk_layernorm_fwd_v8<<<blocks, DTK_THREADS, 0, s>>>((__nv_bfloat16 *)out, mean, rstd, (const __nv_bfloat16 *)inp,
                                                            w, b, N, C);
    else if (t == DTK_BF16) dtk_layernorm_fwd_bf16<<<blocks, DTK_THREADS, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
    else dtk_layernorm_fwd_f32<<<blocks, DTK_THREADS, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
    return cudaGetLastError();
}

// dinp += (w dy - mean(w dy) - n mean(w dy n)) r with n = (x - m) r; one warp per row.
// w dy is rounded alone (__fmul_rn) in both loops: fused into w dy - mean, it would differ from
// the product summed into the mean, and at C = 1 (w dy - mean = 0 exactly on the CPU) that
// rounding error, times r = 1/sqrt(eps), was what the H200 showed (rel 2e-5).
template <typename A>
static __device__ void layernorm_bwd_dinp(void *dinp, const void *dout, const void *inp, const float *w,
                                          const float *mean, const float *rstd, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const A *x = (const A *)inp + off, *dy = (const A *)dout + off;
    const float m = mean[row], r = rstd[row];
    float sa = 0.0f, sb = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float dn = __fmul_rn(w[c], dtk_ld(dy, c));
        sa += dn;
        sb += dn * ((dtk_ld(x, c) - m) * r);
    }
    const float dm = dtk_warp_reduce(sa, DtkSum()) / C, dnm = dtk_warp_reduce(sb, DtkSum()) / C;
    A *dx = (A *)dinp + off;
    for (int c = lane; c < C; c += 32) {
        const float n = (dtk_ld(x, c) - m) * r;
        dtk_st(dx, c, dtk_ld(dx, c) + (__fmul_rn(w[c], dtk_ld(dy, c)) - dm - n * dnm) * r);
    }
}
DTK_ACT_KERNELS(layernorm_bwd_dinp,
                (void *dinp, const void *dout, const void *inp, const float *w, const float *mean, const float *rstd,
                 int N, int C),
                (dinp, dout, inp, w, mean, rstd, N, C))

// The same for bf16 rows of C % 8 == 0 elements, 16-byte aligned: each lane reads 8 elements (16
// bytes) at a time, so a row takes C / 256 loads a lane, not C / 32. The scalar kernel took
// 400 us a call at GPT-2 124M's 16384 x 768 on the H200 (the forward, 27 us): the lanes' 2-byte
// loads kept too few bytes in flight.
static __global__ void dtk_layernorm_bwd_dinp_v8(__nv_bfloat16 *dinp, const __nv_bfloat16 *dout,
                                                 const __nv_bfloat16 *inp, const float *w, const float *mean,
                                                 const float *rstd, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const __nv_bfloat16 *x = inp + off, *dy = dout + off;
    const float m = mean[row], r = rstd[row];
    float sa = 0.0f, sb = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        float fy[8], fx[8];
        dtk_ld8(dy + c, fy);
        dtk_ld8(x + c, fx);
        for (int i = 0; i < 8; i++) {
            const float dn = __fmul_rn(w[c + i], fy[i]);
            sa += dn;
            sb += dn * ((fx[i] - m) * r);
        }
    }
    const float dm = dtk_warp_reduce(sa, DtkSum()) / C, dnm = dtk_warp_reduce(sb, DtkSum()) / C;
    __nv_bfloat16 *dx = dinp + off;
    for (int c = lane * 8; c < C; c += 256) {
        float fy[8], fx[8], fd[8];
        dtk_ld8(dy + c, fy);
        dtk_ld8(x + c, fx);
        dtk_ld8(dx + c, fd);
        for (int i = 0; i < 8; i++) {
            const float n = (fx[i] - m) * r;
            fd[i] = fd[i] + (__fmul_rn(w[c + i], fy[i]) - dm - n * dnm) * r;
        }
        dtk_st8(dx + c, fd);
    }
}

// ---- column reductions in one kernel: LayerNorm's dw and db, and the bias gradient ----
// A grid of (column tile, row chunk) blocks: COL_TILE columns a block, COL_LANES threads a column
// over the chunk's rows (a warp reads 32 consecutive columns of a row). Each block writes its
// chunk's sums (double) into part[chunk * N + column]; then the last block of a tile to finish
// (an atomic count per tile in `flags`, which it sets back to 0 for the next launch) adds the
// chunks' partials into out in a fixed order (lane l of a column takes chunks l, l + 4, ...,
// then the four lanes in order): the same order whichever block is last, so the result does
// not depend on scheduling. Enough chunks that the grid has ~COL_BLOCKS blocks
// (several waves of a 132-SM GPU), where the old per-column final pass ran on N / 256 blocks.
#define COL_TILE 64
#define COL_LANES (DTK_THREADS / COL_TILE)
#define COL_BLOCKS 528
#define COL_MIN_ROWS 32

static int col_tiles(int N) { return (N + COL_TILE - 1) / COL_TILE; }

static int col_chunks(int M, int N) {
    int g = (COL_BLOCKS + col_tiles(N) - 1) / col_tiles(N);
    const int most = (M + COL_MIN_ROWS - 1) / COL_MIN_ROWS; /* chunks of at least COL_MIN_ROWS rows */
    if (g > most) g = most;
    return g < 1 ? 1 : g;
}

static int chunk_rows(int M, int N) { return (M + col_chunks(M, N) - 1) / col_chunks(M, N); }

// What a column sums: the bias gradient, dy; LayerNorm's, dy * n (dw) and dy (db).
template <typename A> struct BiasSrc {
    const A *dy;
    int N;
    __device__ void add(int i, int c, double &a, double &) const { a += dtk_ld(dy, (size_t)i * N + c); }
};
template <typename A> struct LnSrc {
    const A *dy, *x;
    const float *mean, *rstd;
    int N;
    __device__ void add(int i, int c, double &a, double &b) const {
        const size_t k = (size_t)i * N + c;
        const float d = dtk_ld(dy, k);
        a += (double)d * ((dtk_ld(x, k) - mean[i]) * rstd[i]);
        b += d;
    }
};

// RMSNorm's: dy * (x * rstd) (dw)
template <typename A> struct RmsSrc {
    const A *dy, *x;
    const float *rstd;
    int N;
    __device__ void add(int i, int c, double &a, double &) const {
        const size_t k = (size_t)i * N + c;
        a += (double)dtk_ld(dy, k) * (dtk_ld(x, k) * rstd[i]);
    }
};

// out[c] += column c's first sum, out2[c] += its second (out2 NULL: one sum); part holds
// gridDim.y * N doubles per sum; rows: the chunk's length.
template <typename S>
static __device__ void colsum(const S &src, float *out, float *out2, double *part, unsigned *flags, int M, int N,
                              int rows) {
    __shared__ double sa[DTK_THREADS], sb[DTK_THREADS];
    __shared__ int last;
    const int tc = threadIdx.x % COL_TILE, lane = threadIdx.x / COL_TILE, c = blockIdx.x * COL_TILE + tc;
    const int r0 = blockIdx.y * rows, r1 = min(M, r0 + rows);
    double a = 0.0, b = 0.0;
    if (c < N)
        for (int i = r0 + lane; i < r1; i += COL_LANES) src.add(i, c, a, b);
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    double *part2 = part + (size_t)gridDim.y * N;
    if (lane == 0 && c < N) { // the lanes in order (lane 0's own sums are sa[tc], sb[tc])
        for (int l = 1; l < COL_LANES; l++) {
            a += sa[l * COL_TILE + tc];
            b += sb[l * COL_TILE + tc];
        }
        part[(size_t)blockIdx.y * N + c] = a;
        if (out2) part2[(size_t)blockIdx.y * N + c] = b;
    }
    __threadfence(); // each writer's partials reach L2 before it arrives at the barrier,
    __syncthreads(); // so all of them (two warps write) before thread 0 counts the block
    if (threadIdx.x == 0) last = atomicAdd(&flags[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    a = b = 0.0;
    if (c < N)
        for (int g = lane; g < (int)gridDim.y; g += COL_LANES) { // L2 reads (__ldcg): written by other blocks
            a += __ldcg(part + (size_t)g * N + c);
            if (out2) b += __ldcg(part2 + (size_t)g * N + c);
        }
    sa[threadIdx.x] = a; // after the barrier below `last`: the reads of sa, sb above are done
    sb[threadIdx.x] = b;
    __syncthreads();
    if (lane == 0 && c < N) {
        for (int l = 1; l < COL_LANES; l++) {
            a += sa[l * COL_TILE + tc];
            b += sb[l * COL_TILE + tc];
        }
        out[c] += (float)a;
        if (out2) out2[c] += (float)b;
    }
    if (threadIdx.x == 0) flags[blockIdx.x] = 0;
}

template <typename A>
static __device__ void layernorm_bwd_cols(float *dw, float *db, double *part, unsigned *flags, const void *dout,
                                          const void *inp, const float *mean, const float *rstd, int N, int C,
                                          int rows) {
    const LnSrc<A> src = {(const A *)dout, (const A *)inp, mean, rstd, C};
    colsum(src, dw, db, part, flags, N, C, rows);
}
DTK_ACT_KERNELS(layernorm_bwd_cols,
                (float *dw, float *db, double *part, unsigned *flags, const void *dout, const void *inp,
                 const float *mean, const float *rstd, int N, int C, int rows),
                (dw, db, part, flags, dout, inp, mean, rstd, N, C, rows))

template <typename A>
static __device__ void bias_bwd_cols(float *dbias, double *part, unsigned *flags, const void *dout, int M, int N,
                                     int rows) {
    const BiasSrc<A> src = {(const A *)dout, N};
    colsum(src, dbias, (float *)nullptr, part, flags, M, N, rows);
}
DTK_ACT_KERNELS(bias_bwd_cols, (float *dbias, double *part, unsigned *flags, const void *dout, int M, int N, int rows),
                (dbias, part, flags, dout, M, N, rows))

extern "C" int dtk_colsum_flags(int N) { return N > 0 ? col_tiles(N) : 0; }

// work = [dw partials | db partials]: chunks * C doubles each
extern "C" size_t dtk_layernorm_bwd_work_bytes(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return 2 * (size_t)col_chunks(N, C) * C * sizeof(double);
}

extern "C" cudaError_t dtk_layernorm_bwd(cudaStream_t s, dtk_type t, void *dinp, float *dw, float *db,
                                         const void *dout, const void *inp, const float *w, const float *mean,
                                         const float *rstd, int N, int C, void *work, size_t work_bytes,
                                         unsigned *flags) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_layernorm_bwd_work_bytes(N, C) || flags == nullptr) return cudaErrorInvalidValue;
    const unsigned row_blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    if (t == DTK_BF16 && C % 8 == 0 && dtk_aligned16(dinp) && dtk_aligned16(dout) && dtk_aligned16(inp))
        dtk_layernorm_bwd_dinp_v8<<<row_blocks, DTK_THREADS, 0, s>>>((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)dout,
                                                                     (const __nv_bfloat16 *)inp, w, mean, rstd, N, C);
    else if (t == DTK_BF16) dtk_layernorm_bwd_dinp_bf16<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
    else dtk_layernorm_bwd_dinp_f32<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || (dw == nullptr && db == nullptr)) return e; /* frozen weights (model.lora) */
    if (dw == nullptr || db == nullptr) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)col_tiles(C), (unsigned)col_chunks(N, C));
    double *part = (double *)work;
    const int rows = chunk_rows(N, C);
    if (t == DTK_BF16) dtk_layernorm_bwd_cols_bf16<<<grid, DTK_THREADS, 0, s>>>(dw, db, part, flags, dout, inp, mean, rstd, N, C, rows);
    else dtk_layernorm_bwd_cols_f32<<<grid, DTK_THREADS, 0, s>>>(dw, db, part, flags, dout, inp, mean, rstd, N, C, rows);
    return cudaGetLastError();
}

// work = chunks * N doubles (dout's M rows in chunks)
extern "C" size_t dtk_bias_bwd_work_bytes(int M, int N) {
    if (M <= 0 || N <= 0) return 0;
    return (size_t)col_chunks(M, N) * N * sizeof(double);
}

extern "C" cudaError_t dtk_bias_bwd(cudaStream_t s, dtk_type t, float *dbias, const void *dout, int M, int N,
                                    void *work, size_t work_bytes, unsigned *flags) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_bias_bwd_work_bytes(M, N) || flags == nullptr) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)col_tiles(N), (unsigned)col_chunks(M, N));
    if (t == DTK_BF16) dtk_bias_bwd_cols_bf16<<<grid, DTK_THREADS, 0, s>>>(dbias, (double *)work, flags, dout, M, N, chunk_rows(M, N));
    else dtk_bias_bwd_cols_f32<<<grid, DTK_THREADS, 0, s>>>(dbias, (double *)work, flags, dout, M, N, chunk_rows(M, N));
    return cudaGetLastError();
}

// ---- RMSNorm: out = w * (x * r), r = (mean(x^2) + eps)^-1/2; one warp per row, as LayerNorm ----

template <typename A>
static __device__ void rmsnorm_fwd(void *out_, float *rstd, const void *inp, const float *w, int N, int C, float eps) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const A *x = (const A *)inp + (size_t)row * C;
    double v = 0.0; // in double, as the CPU
    for (int c = lane; c < C; c += 32) {
        const float xc = dtk_ld(x, c);
        v += (double)xc * xc;
    }
    const float r = 1.0f / sqrtf((float)(dtk_warp_reduce(v, DtkSum()) / C) + eps);
    A *o = (A *)out_ + (size_t)row * C;
    for (int c = lane; c < C; c += 32) dtk_st(o, c, w[c] * (dtk_ld(x, c) * r));
    if (lane == 0) rstd[row] = r;
}
DTK_ACT_KERNELS(rmsnorm_fwd, (void *out, float *rstd, const void *inp, const float *w, int N, int C, float eps),
                (out, rstd, inp, w, N, C, eps))

// dinp += r w dy - x r^3 mean(w dy x)
template <typename A>
static __device__ void rmsnorm_bwd_dinp(void *dinp, const void *dout, const void *inp, const float *w,
                                        const float *rstd, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const A *x = (const A *)inp + off, *dy = (const A *)dout + off;
    const float r = rstd[row];
    double s = 0.0;
    for (int c = lane; c < C; c += 32) s += (double)(w[c] * dtk_ld(dy, c)) * dtk_ld(x, c);
    const float k = (float)(dtk_warp_reduce(s, DtkSum()) / C) * r * r * r;
    A *dx = (A *)dinp + off;
    for (int c = lane; c < C; c += 32) dtk_st(dx, c, dtk_ld(dx, c) + (r * (w[c] * dtk_ld(dy, c)) - k * dtk_ld(x, c)));
}
DTK_ACT_KERNELS(rmsnorm_bwd_dinp,
                (void *dinp, const void *dout, const void *inp, const float *w, const float *rstd, int N, int C),
                (dinp, dout, inp, w, rstd, N, C))

// The same for bf16 rows of C % 8 == 0 elements, 16-byte aligned, 8 elements a load (as
// dtk_layernorm_bwd_dinp_v8)
static __global__ void dtk_rmsnorm_bwd_dinp_v8(__nv_bfloat16 *dinp, const __nv_bfloat16 *dout,
                                               const __nv_bfloat16 *inp, const float *w, const float *rstd, int N,
                                               int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const __nv_bfloat16 *x = inp + off, *dy = dout + off;
    const float r = rstd[row];
    double s = 0.0;
    for (int c = lane * 8; c < C; c += 256) {
        float fy[8], fx[8];
        dtk_ld8(dy + c, fy);
        dtk_ld8(x + c, fx);
        for (int i = 0; i < 8; i++) s += (double)(w[c + i] * fy[i]) * fx[i];
    }
    const float k = (float)(dtk_warp_reduce(s, DtkSum()) / C) * r * r * r;
    __nv_bfloat16 *dx = dinp + off;
    for (int c = lane * 8; c < C; c += 256) {
        float fy[8], fx[8], fd[8];
        dtk_ld8(dy + c, fy);
        dtk_ld8(x + c, fx);
        dtk_ld8(dx + c, fd);
        for (int i = 0; i < 8; i++) fd[i] = fd[i] + (r * (w[c + i] * fy[i]) - k * fx[i]);
        dtk_st8(dx + c, fd);
    }
}

template <typename A>
static __device__ void rmsnorm_bwd_cols(float *dw, double *part, unsigned *flags, const void *dout, const void *inp,
                                        const float *rstd, int N, int C, int rows) {
    const RmsSrc<A> src = {(const A *)dout, (const A *)inp, rstd, C};
    colsum(src, dw, (float *)nullptr, part, flags, N, C, rows);
}
DTK_ACT_KERNELS(rmsnorm_bwd_cols,
                (float *dw, double *part, unsigned *flags, const void *dout, const void *inp, const float *rstd, int N,
                 int C, int rows),
                (dw, part, flags, dout, inp, rstd, N, C, rows))

// The same for bf16 rows of C % 8 == 0 elements, 16-byte aligned, 8 elements a load
static __global__ void dtk_rmsnorm_fwd_v8(__nv_bfloat16 *out, float *rstd, const __nv_bfloat16 *inp, const float *w,
                                          int N, int C, float eps) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const __nv_bfloat16 *x = inp + (size_t)row * C;
    double v = 0.0; // in double, as the CPU
    for (int c = lane * 8; c < C; c += 256) {
        float f[8];
        dtk_ld8(x + c, f);
        for (int i = 0; i < 8; i++) v += (double)f[i] * f[i];
    }
    const float r = 1.0f / sqrtf((float)(dtk_warp_reduce(v, DtkSum()) / C) + eps);
    __nv_bfloat16 *o = out + (size_t)row * C;
    for (int c = lane * 8; c < C; c += 256) {
        float f[8];
        dtk_ld8(x + c, f);
        for (int i = 0; i < 8; i++) f[i] = w[c + i] * (f[i] * r);
        dtk_st8(o + c, f);
    }
    if (lane == 0) rstd[row] = r;
}

extern "C" cudaError_t dtk_rmsnorm_fwd(cudaStream_t s, dtk_type t, void *out, float *rstd, const void *inp,
                                       const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    if (t == DTK_BF16 && C % 8 == 0 && dtk_aligned16(out) && dtk_aligned16(inp))
        dtk_rmsnorm_fwd_v8<<<blocks, DTK_THREADS, 0, s>>>((__nv_bfloat16 *)out, rstd, (const __nv_bfloat16 *)inp, w, N, C,
                                                          eps);
    else if (t == DTK_BF16) dtk_rmsnorm_fwd_bf16<<<blocks, DTK_THREADS, 0, s>>>(out, rstd, inp, w, N, C, eps);
    else dtk_rmsnorm_fwd_f32<<<blocks, DTK_THREADS, 0, s>>>(out, rstd, inp, w, N, C, eps);
    return cudaGetLastError();
}

// work = dw partials: chunks * C doubles (the bias gradient's size for N x C)
extern "C" size_t dtk_rmsnorm_bwd_work_bytes(int N, int C) { return dtk_bias_bwd_work_bytes(N, C); }

extern "C" cudaError_t dtk_rmsnorm_bwd(cudaStream_t s, dtk_type t, void *dinp, float *dw, const void *dout,
                                       const void *inp, const float *w, const float *rstd, int N, int C, void *work,
                                       size_t work_bytes, unsigned *flags) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_rmsnorm_bwd_work_bytes(N, C) || flags == nullptr) return cudaErrorInvalidValue;
    const unsigned row_blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    if (t == DTK_BF16 && C % 8 == 0 && dtk_aligned16(dinp) && dtk_aligned16(dout) && dtk_aligned16(inp))
        dtk_rmsnorm_bwd_dinp_v8<<<row_blocks, DTK_THREADS, 0, s>>>((__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)dout,
                                                                   (const __nv_bfloat16 *)inp, w, rstd, N, C);
    else if (t == DTK_BF16) dtk_rmsnorm_bwd_dinp_bf16<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
    else dtk_rmsnorm_bwd_dinp_f32<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || dw == nullptr) return e; /* a frozen weight (model.lora) */
    const dim3 grid((unsigned)col_tiles(C), (unsigned)col_chunks(N, C));
    double *part = (double *)work;
    const int rows = chunk_rows(N, C);
    if (t == DTK_BF16) dtk_rmsnorm_bwd_cols_bf16<<<grid, DTK_THREADS, 0, s>>>(dw, part, flags, dout, inp, rstd, N, C, rows);
    else dtk_rmsnorm_bwd_cols_f32<<<grid, DTK_THREADS, 0, s>>>(dw, part, flags, dout, inp, rstd, N, C, rows);
    return cudaGetLastError();
}
