// elementwise.cu — grid-stride element-wise kernels (GELU forward/backward, add, scale,
// bf16 cast) and the row gather / deterministic scatter-add used by pooling.
#include "dtk.h"
#include "dtk_common.cuh"

#define GELU_K 0.7978845608028654f // sqrt(2/pi)
// exp's argument is capped here (as the CPU's fast_expf does at 88): for x < about -10
// expf(-2u) would overflow to inf, and gelu_bwd would compute inf * 0 = NaN.
#define EXP_ARG_MAX 88.0f

#define GRID_STRIDE(i, n)                                                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3); 0.5 (1 + tanh u) = 1 / (1 + exp(-2u))
static __device__ inline float gelu_exp(float x) {
    return expf(fminf(-2.0f * GELU_K * (x + 0.044715f * x * x * x), EXP_ARG_MAX));
}

// out = 0.5 x (1 + tanh u) = x / (1 + exp(-2u)) (the CPU's form: no cancellation for x << 0)
static __global__ void gelu_fwd_kernel(float *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) {
        const float x = inp[i];
        out[i] = x / (1.0f + gelu_exp(x));
    }
}

// gelu'(x) = s + 2 x s (1 - s) u' with s = 1 / (1 + e), 1 - s = e s, u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
static __global__ void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        const float x = inp[i], e = gelu_exp(x);
        const float sg = 1.0f / (1.0f + e);
        const float g = sg + 2.0f * x * sg * (e * sg) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

static __global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

static __global__ void scale_kernel(float *x, size_t n, float scale) { GRID_STRIDE(i, n) x[i] *= scale; }

static __global__ void cast_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(in[i]);
}

static __global__ void widen_bf16_kernel(float *out, const __nv_bfloat16 *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}

extern "C" cudaError_t dtk_gelu_fwd(cudaStream_t s, float *out, const float *inp, size_t n) {
    if (n == 0) return cudaSuccess;
    gelu_fwd_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, inp, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_gelu_bwd(cudaStream_t s, float *dinp, const float *inp, const float *dout, size_t n) {
    if (n == 0) return cudaSuccess;
    gelu_bwd_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(dinp, inp, dout, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_add(cudaStream_t s, float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return cudaSuccess;
    add_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, a, b, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_scale(cudaStream_t s, float *x, size_t n, float scale) {
    if (n == 0) return cudaSuccess;
    scale_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(x, n, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_cast_bf16(cudaStream_t s, dtk_bf16 *out, const float *in, size_t n) {
    if (n == 0) return cudaSuccess;
    cast_bf16_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, in, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_widen_bf16(cudaStream_t s, float *out, const dtk_bf16 *in, size_t n) {
    if (n == 0) return cudaSuccess;
    widen_bf16_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, in, n);
    return cudaGetLastError();
}

// One block per output row i, threads over the columns.
static __global__ void gather_rows_kernel(float *out, const float *x, const int *rows, int C) {
    const float *src = x + (size_t)rows[blockIdx.x] * C;
    float *dst = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

// One thread per column, rows i = 0..n-1 in order: duplicate rows accumulate in the same
// order as on the CPU, with no atomics.
static __global__ void scatter_add_rows_kernel(float *dx, const float *dout, const int *rows, int n, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        for (int i = 0; i < n; i++) dx[(size_t)rows[i] * C + c] += dout[(size_t)i * C + c];
}

extern "C" cudaError_t dtk_gather_rows(cudaStream_t s, float *out, const float *x, const int *rows, int n, int C) {
    if (n <= 0 || C <= 0) return cudaSuccess;
    gather_rows_kernel<<<n, DTK_THREADS, 0, s>>>(out, x, rows, C);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_scatter_add_rows(cudaStream_t s, float *dx, const float *dout, const int *rows, int n,
                                            int C) {
    if (n <= 0 || C <= 0) return cudaSuccess;
    scatter_add_rows_kernel<<<dtk_blocks((size_t)C), DTK_THREADS, 0, s>>>(dx, dout, rows, n, C);
    return cudaGetLastError();
}
