// layernorm.cu — LayerNorm forward and backward (eps 1e-5, biased variance), plus the
// shared column-reduction pattern of bias_bwd: per-row-group partial sums in double into
// `work`, then one thread per column adds the groups in order (no atomics).
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

extern "C" cudaError_t dtk_layernorm_fwd(cudaStream_t s, dtk_type t, void *out, float *mean, float *rstd,
                                         const void *inp, const float *w, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    if (t == DTK_BF16) dtk_layernorm_fwd_bf16<<<blocks, DTK_THREADS, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
    else dtk_layernorm_fwd_f32<<<blocks, DTK_THREADS, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
    return cudaGetLastError();
}

// dinp += (w dy - mean(w dy) - n mean(w dy n)) r with n = (x - m) r; one warp per row.
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
        const float dn = w[c] * dtk_ld(dy, c);
        sa += dn;
        sb += dn * ((dtk_ld(x, c) - m) * r);
    }
    const float dm = dtk_warp_reduce(sa, DtkSum()) / C, dnm = dtk_warp_reduce(sb, DtkSum()) / C;
    A *dx = (A *)dinp + off;
    for (int c = lane; c < C; c += 32) {
        const float n = (dtk_ld(x, c) - m) * r;
        dtk_st(dx, c, dtk_ld(dx, c) + (w[c] * dtk_ld(dy, c) - dm - n * dnm) * r);
    }
}
DTK_ACT_KERNELS(layernorm_bwd_dinp,
                (void *dinp, const void *dout, const void *inp, const float *w, const float *mean, const float *rstd,
                 int N, int C),
                (dinp, dout, inp, w, mean, rstd, N, C))

// Rows are cut into groups of `rows` consecutive rows (at most MAX_GROUPS groups); the
// partials of group g for column c live at part[g*C + c].
#define MIN_GROUP_ROWS 32
#define MAX_GROUPS 1024

static int group_rows(int N) {
    const int r = (N + MAX_GROUPS - 1) / MAX_GROUPS;
    return r > MIN_GROUP_ROWS ? r : MIN_GROUP_ROWS;
}

static int n_groups(int N) { return (N + group_rows(N) - 1) / group_rows(N); }

static dim3 partial_grid(int N, int C) {
    return dim3((unsigned)((C + DTK_THREADS - 1) / DTK_THREADS), (unsigned)n_groups(N));
}

// Per (column, row group): pw = sum dy * n, pb = sum dy over the group's rows, in double.
template <typename A>
static __device__ void layernorm_bwd_partial(double *pw, double *pb, const void *dout_, const void *inp_,
                                             const float *mean, const float *rstd, int N, int C, int rows) {
    const A *dout = (const A *)dout_, *inp = (const A *)inp_;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int r0 = blockIdx.y * rows, r1 = min(N, r0 + rows);
    double aw = 0.0, ab = 0.0;
    for (int i = r0; i < r1; i++) {
        const size_t k = (size_t)i * C + c;
        const float dy = dtk_ld(dout, k);
        aw += (double)dy * ((dtk_ld(inp, k) - mean[i]) * rstd[i]);
        ab += dy;
    }
    const size_t p = (size_t)blockIdx.y * C + c;
    pw[p] = aw;
    pb[p] = ab;
}
DTK_ACT_KERNELS(layernorm_bwd_partial,
                (double *pw, double *pb, const void *dout, const void *inp, const float *mean, const float *rstd, int N,
                 int C, int rows),
                (pw, pb, dout, inp, mean, rstd, N, C, rows))

// out[c] += sum over groups g = 0..G-1 (in order) of part[g*C + c]; `part2`/`out2` optional.
static __global__ void dtk_colsum_groups_kernel(float *out, const double *part, float *out2, const double *part2, int G,
                                            int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a = 0.0, a2 = 0.0;
    for (int g = 0; g < G; g++) {
        a += part[(size_t)g * C + c];
        if (part2) a2 += part2[(size_t)g * C + c];
    }
    out[c] += (float)a;
    if (out2) out2[c] += (float)a2;
}

// work = [pw: G*C doubles | pb: G*C doubles], each 256-aligned
extern "C" size_t dtk_layernorm_bwd_work_bytes(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return 2 * dtk_align((size_t)n_groups(N) * C * sizeof(double));
}

extern "C" cudaError_t dtk_layernorm_bwd(cudaStream_t s, dtk_type t, void *dinp, float *dw, float *db,
                                         const void *dout, const void *inp, const float *w, const float *mean,
                                         const float *rstd, int N, int C, void *work, size_t work_bytes) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_layernorm_bwd_work_bytes(N, C)) return cudaErrorInvalidValue;
    const unsigned row_blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    if (t == DTK_BF16) dtk_layernorm_bwd_dinp_bf16<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
    else dtk_layernorm_bwd_dinp_f32<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int G = n_groups(N), gr = group_rows(N);
    double *pw = (double *)work, *pb = (double *)((char *)work + dtk_align((size_t)G * C * sizeof(double)));
    if (t == DTK_BF16) dtk_layernorm_bwd_partial_bf16<<<partial_grid(N, C), DTK_THREADS, 0, s>>>(pw, pb, dout, inp, mean, rstd, N, C, gr);
    else dtk_layernorm_bwd_partial_f32<<<partial_grid(N, C), DTK_THREADS, 0, s>>>(pw, pb, dout, inp, mean, rstd, N, C, gr);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    dtk_colsum_groups_kernel<<<(C + DTK_THREADS - 1) / DTK_THREADS, DTK_THREADS, 0, s>>>(dw, pw, db, pb, G, C);
    return cudaGetLastError();
}

// dbias[j] += sum_i dout[i,j]: per row group, in double, then the groups in order.
template <typename A> static __device__ void colsum_partial(double *part, const void *x_, int M, int N, int rows) {
    const A *x = (const A *)x_;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N) return;
    const int r0 = blockIdx.y * rows, r1 = min(M, r0 + rows);
    double a = 0.0;
    for (int i = r0; i < r1; i++) a += dtk_ld(x, (size_t)i * N + j);
    part[(size_t)blockIdx.y * N + j] = a;
}
DTK_ACT_KERNELS(colsum_partial, (double *part, const void *x, int M, int N, int rows), (part, x, M, N, rows))

// work = G*N doubles (G row groups of dout's M rows)
extern "C" size_t dtk_bias_bwd_work_bytes(int M, int N) {
    if (M <= 0 || N <= 0) return 0;
    return dtk_align((size_t)n_groups(M) * N * sizeof(double));
}

extern "C" cudaError_t dtk_bias_bwd(cudaStream_t s, dtk_type t, float *dbias, const void *dout, int M, int N,
                                    void *work, size_t work_bytes) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_bias_bwd_work_bytes(M, N)) return cudaErrorInvalidValue;
    double *part = (double *)work;
    if (t == DTK_BF16) dtk_colsum_partial_bf16<<<partial_grid(M, N), DTK_THREADS, 0, s>>>(part, dout, M, N, group_rows(M));
    else dtk_colsum_partial_f32<<<partial_grid(M, N), DTK_THREADS, 0, s>>>(part, dout, M, N, group_rows(M));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dtk_colsum_groups_kernel<<<(N + DTK_THREADS - 1) / DTK_THREADS, DTK_THREADS, 0, s>>>(dbias, part, nullptr, nullptr,
                                                                                     n_groups(M), N);
    return cudaGetLastError();
}
