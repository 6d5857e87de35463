// layernorm.cu — LayerNorm forward and backward (eps 1e-5, biased variance), plus the
// shared column-reduction pattern of bias_bwd: per-row-group partial sums in double into
// `work`, then one thread per column adds the groups in order (no atomics).
#include "dtk.h"
#include "dtk_common.cuh"

#define LN_EPS 1e-5f

// One warp per row, lanes strided over the columns; two passes (mean, then the variance of
// x - mean, as the CPU computes it).
static __global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                            const float *b, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    // sums in double, as the CPU: a float sum of C values loses the mean's low bits when
    // |mean| >> std, and every (x - m) inherits that error
    double s = 0.0;
    for (int c = lane; c < C; c += 32) s += x[c];
    const float m = (float)(dtk_warp_reduce(s, DtkSum()) / C);
    double v = 0.0;
    for (int c = lane; c < C; c += 32) {
        const float d = x[c] - m;
        v += (double)d * d;
    }
    const float r = 1.0f / sqrtf((float)(dtk_warp_reduce(v, DtkSum()) / C) + LN_EPS);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" cudaError_t dtk_layernorm_fwd(cudaStream_t s, float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    layernorm_fwd_kernel<<<blocks, DTK_THREADS, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
    return cudaGetLastError();
}

// dinp += (w dy - mean(w dy) - n mean(w dy n)) r with n = (x - m) r; one warp per row.
static __global__ void layernorm_bwd_dinp_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                                 const float *mean, const float *rstd, int N, int C) {
    const int row = blockIdx.x * DTK_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const float *x = inp + off, *dy = dout + off;
    const float m = mean[row], r = rstd[row];
    float sa = 0.0f, sb = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float dn = w[c] * dy[c];
        sa += dn;
        sb += dn * ((x[c] - m) * r);
    }
    const float dm = dtk_warp_reduce(sa, DtkSum()) / C, dnm = dtk_warp_reduce(sb, DtkSum()) / C;
    float *dx = dinp + off;
    for (int c = lane; c < C; c += 32) {
        const float n = (x[c] - m) * r;
        dx[c] += (w[c] * dy[c] - dm - n * dnm) * r;
    }
}

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
static __global__ void layernorm_bwd_partial_kernel(double *pw, double *pb, const float *dout, const float *inp,
                                                    const float *mean, const float *rstd, int N, int C, int rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int r0 = blockIdx.y * rows, r1 = min(N, r0 + rows);
    double aw = 0.0, ab = 0.0;
    for (int i = r0; i < r1; i++) {
        const size_t k = (size_t)i * C + c;
        const float dy = dout[k];
        aw += (double)dy * ((inp[k] - mean[i]) * rstd[i]);
        ab += dy;
    }
    const size_t p = (size_t)blockIdx.y * C + c;
    pw[p] = aw;
    pb[p] = ab;
}

// out[c] += sum over groups g = 0..G-1 (in order) of part[g*C + c]; `part2`/`out2` optional.
static __global__ void colsum_groups_kernel(float *out, const double *part, float *out2, const double *part2, int G,
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

extern "C" cudaError_t dtk_layernorm_bwd(cudaStream_t s, float *dinp, float *dw, float *db, const float *dout,
                                         const float *inp, const float *w, const float *mean, const float *rstd, int N,
                                         int C, void *work, size_t work_bytes) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_layernorm_bwd_work_bytes(N, C)) return cudaErrorInvalidValue;
    const unsigned row_blocks = (unsigned)((N + DTK_ROWS_PER_BLOCK - 1) / DTK_ROWS_PER_BLOCK);
    layernorm_bwd_dinp_kernel<<<row_blocks, DTK_THREADS, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int G = n_groups(N);
    double *pw = (double *)work, *pb = (double *)((char *)work + dtk_align((size_t)G * C * sizeof(double)));
    layernorm_bwd_partial_kernel<<<partial_grid(N, C), DTK_THREADS, 0, s>>>(pw, pb, dout, inp, mean, rstd, N, C,
                                                                            group_rows(N));
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    colsum_groups_kernel<<<(C + DTK_THREADS - 1) / DTK_THREADS, DTK_THREADS, 0, s>>>(dw, pw, db, pb, G, C);
    return cudaGetLastError();
}

// dbias[j] += sum_i dout[i,j]: per row group, in double, then the groups in order.
static __global__ void colsum_partial_kernel(double *part, const float *x, int M, int N, int rows) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N) return;
    const int r0 = blockIdx.y * rows, r1 = min(M, r0 + rows);
    double a = 0.0;
    for (int i = r0; i < r1; i++) a += x[(size_t)i * N + j];
    part[(size_t)blockIdx.y * N + j] = a;
}

// work = G*N doubles (G row groups of dout's M rows)
extern "C" size_t dtk_bias_bwd_work_bytes(int M, int N) {
    if (M <= 0 || N <= 0) return 0;
    return dtk_align((size_t)n_groups(M) * N * sizeof(double));
}

extern "C" cudaError_t dtk_bias_bwd(cudaStream_t s, float *dbias, const float *dout, int M, int N, void *work,
                                    size_t work_bytes) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (work == nullptr || work_bytes < dtk_bias_bwd_work_bytes(M, N)) return cudaErrorInvalidValue;
    double *part = (double *)work;
    colsum_partial_kernel<<<partial_grid(M, N), DTK_THREADS, 0, s>>>(part, dout, M, N, group_rows(M));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    colsum_groups_kernel<<<(N + DTK_THREADS - 1) / DTK_THREADS, DTK_THREADS, 0, s>>>(dbias, part, nullptr, nullptr,
                                                                                     n_groups(M), N);
    return cudaGetLastError();
}
