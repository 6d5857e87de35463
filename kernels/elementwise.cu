// elementwise.cu — grid-stride element-wise kernels (GELU and SwiGLU forward/backward, add,
// scale, bf16 cast) and the row gather / deterministic scatter-add used by pooling.
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
template <typename A> static __device__ void gelu_fwd(void *out_, const void *inp_, size_t n) {
    A *out = (A *)out_;
    const A *inp = (const A *)inp_;
    GRID_STRIDE(i, n) {
        const float x = dtk_ld(inp, i);
        dtk_st(out, i, x / (1.0f + gelu_exp(x)));
    }
}
DTK_ACT_KERNELS(gelu_fwd, (void *out, const void *inp, size_t n), (out, inp, n))

// gelu'(x) = s + 2 x s (1 - s) u' with s = 1 / (1 + e), 1 - s = e s, u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
template <typename A> static __device__ void gelu_bwd(void *dinp_, const void *inp_, const void *dout_, size_t n) {
    A *dinp = (A *)dinp_;
    const A *inp = (const A *)inp_, *dout = (const A *)dout_;
    GRID_STRIDE(i, n) {
        const float x = dtk_ld(inp, i), e = gelu_exp(x);
        const float sg = 1.0f / (1.0f + e);
        const float g = sg + 2.0f * x * sg * (e * sg) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dtk_st(dinp, i, g * dtk_ld(dout, i));
    }
}
DTK_ACT_KERNELS(gelu_bwd, (void *dinp, const void *inp, const void *dout, size_t n), (dinp, inp, dout, n))

// SwiGLU over rows [gate | up] of 2F: element k = r*F + i of out reads gate r*2F + i and up
// r*2F + F + i. silu(g) = g / (1 + e^-g) (e^-g capped as GELU's: the same 0 for g << 0, no inf).
static __device__ inline float silu_sig(float g) { return 1.0f / (1.0f + expf(fminf(-g, EXP_ARG_MAX))); }

template <typename A> static __device__ void swiglu_fwd(void *out_, const void *inp_, size_t n, int F) {
    A *out = (A *)out_;
    const A *inp = (const A *)inp_;
    GRID_STRIDE(k, n) {
        const size_t r = k / F, gi = k + r * F; // r*2F + i
        const float g = dtk_ld(inp, gi);
        dtk_st(out, k, g / (1.0f + expf(fminf(-g, EXP_ARG_MAX))) * dtk_ld(inp, gi + F));
    }
}
DTK_ACT_KERNELS(swiglu_fwd, (void *out, const void *inp, size_t n, int F), (out, inp, n, F))

// d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)); d up = dy silu(g)
template <typename A> static __device__ void swiglu_bwd(void *dinp_, const void *inp_, const void *dout_, size_t n, int F) {
    A *dinp = (A *)dinp_;
    const A *inp = (const A *)inp_, *dout = (const A *)dout_;
    GRID_STRIDE(k, n) {
        const size_t r = k / F, gi = k + r * F;
        const float g = dtk_ld(inp, gi), u = dtk_ld(inp, gi + F), dy = dtk_ld(dout, k), sg = silu_sig(g);
        dtk_st(dinp, gi, dy * u * (sg * (1.0f + g * (1.0f - sg))));
        dtk_st(dinp, gi + F, dy * (g * sg));
    }
}
DTK_ACT_KERNELS(swiglu_bwd, (void *dinp, const void *inp, const void *dout, size_t n, int F), (dinp, inp, dout, n, F))

template <typename A> static __device__ void add(void *out_, const void *a_, const void *b_, size_t n) {
    A *out = (A *)out_;
    const A *a = (const A *)a_, *b = (const A *)b_;
    GRID_STRIDE(i, n) dtk_st(out, i, dtk_ld(a, i) + dtk_ld(b, i));
}
DTK_ACT_KERNELS(add, (void *out, const void *a, const void *b, size_t n), (out, a, b, n))

// every range in turn, each a grid-stride loop of the whole grid
static __global__ void dtk_scale_kernel(float *x, const dtk_range *ranges, int n_ranges, float scale) {
    for (int r = 0; r < n_ranges; r++) {
        float *y = x + ranges[r].offset;
        GRID_STRIDE(i, ranges[r].numel) y[i] *= scale;
    }
}

static __global__ void dtk_cast_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(in[i]);
}

// rows of `cols` elements, `ld` apart in both: only those columns are written
static __global__ void dtk_cast_bf16_rows_kernel(__nv_bfloat16 *out, const float *in, size_t rows, size_t cols,
                                                 size_t ld) {
    GRID_STRIDE(i, rows * cols) {
        const size_t k = i / cols * ld + i % cols;
        out[k] = __float2bfloat16_rn(in[k]);
    }
}

static __global__ void dtk_widen_bf16_kernel(float *out, const __nv_bfloat16 *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}

extern "C" cudaError_t dtk_gelu_fwd(cudaStream_t s, dtk_type t, void *out, const void *inp, size_t n) {
    if (n == 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_gelu_fwd_bf16<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, inp, n);
    else dtk_gelu_fwd_f32<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, inp, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_gelu_bwd(cudaStream_t s, dtk_type t, void *dinp, const void *inp, const void *dout,
                                    size_t n) {
    if (n == 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_gelu_bwd_bf16<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(dinp, inp, dout, n);
    else dtk_gelu_bwd_f32<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(dinp, inp, dout, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_swiglu_fwd(cudaStream_t s, dtk_type t, void *out, const void *inp, int N, int F) {
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(F > 0 ? F : 0);
    if (n == 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_swiglu_fwd_bf16<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, inp, n, F);
    else dtk_swiglu_fwd_f32<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, inp, n, F);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_swiglu_bwd(cudaStream_t s, dtk_type t, void *dinp, const void *inp, const void *dout, int N,
                                      int F) {
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(F > 0 ? F : 0);
    if (n == 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_swiglu_bwd_bf16<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(dinp, inp, dout, n, F);
    else dtk_swiglu_bwd_f32<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(dinp, inp, dout, n, F);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_add(cudaStream_t s, dtk_type t, void *out, const void *a, const void *b, size_t n) {
    if (n == 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_add_bf16<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, a, b, n);
    else dtk_add_f32<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, a, b, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_scale(cudaStream_t s, float *x, const dtk_range *ranges, int n_ranges, size_t total,
                                 float scale) {
    if (total == 0) return cudaSuccess;
    dtk_scale_kernel<<<dtk_blocks(total), DTK_THREADS, 0, s>>>(x, ranges, n_ranges, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_cast_bf16(cudaStream_t s, dtk_bf16 *out, const float *in, size_t n) {
    if (n == 0) return cudaSuccess;
    dtk_cast_bf16_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, in, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_cast_bf16_rows(cudaStream_t s, dtk_bf16 *out, const float *in, size_t rows, size_t cols,
                                          size_t ld) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    if (ld == cols) return dtk_cast_bf16(s, out, in, rows * cols);
    dtk_cast_bf16_rows_kernel<<<dtk_blocks(rows * cols), DTK_THREADS, 0, s>>>(out, in, rows, cols, ld);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_widen_bf16(cudaStream_t s, float *out, const dtk_bf16 *in, size_t n) {
    if (n == 0) return cudaSuccess;
    dtk_widen_bf16_kernel<<<dtk_blocks(n), DTK_THREADS, 0, s>>>(out, in, n);
    return cudaGetLastError();
}

// One block per output row i, threads over the columns.
template <typename A> static __device__ void gather_rows(void *out_, const void *x_, const int *rows, int C) {
    const A *src = (const A *)x_ + (size_t)rows[blockIdx.x] * C;
    A *dst = (A *)out_ + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}
DTK_ACT_KERNELS(gather_rows, (void *out, const void *x, const int *rows, int C), (out, x, rows, C))

// One thread per column, rows i = 0..n-1 in order: duplicate rows accumulate in the same
// order as on the CPU, with no atomics (bf16: each sum in float, rounded as it is stored).
template <typename A>
static __device__ void scatter_add_rows(void *dx_, const void *dout_, const int *rows, int n, int C) {
    A *dx = (A *)dx_;
    const A *dout = (const A *)dout_;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)rows[i] * C + c;
            dtk_st(dx, k, dtk_ld(dx, k) + dtk_ld(dout, (size_t)i * C + c));
        }
}
DTK_ACT_KERNELS(scatter_add_rows, (void *dx, const void *dout, const int *rows, int n, int C), (dx, dout, rows, n, C))

extern "C" cudaError_t dtk_gather_rows(cudaStream_t s, dtk_type t, void *out, const void *x, const int *rows, int n,
                                       int C) {
    if (n <= 0 || C <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_gather_rows_bf16<<<n, DTK_THREADS, 0, s>>>(out, x, rows, C);
    else dtk_gather_rows_f32<<<n, DTK_THREADS, 0, s>>>(out, x, rows, C);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_scatter_add_rows(cudaStream_t s, dtk_type t, void *dx, const void *dout, const int *rows,
                                            int n, int C) {
    if (n <= 0 || C <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_scatter_add_rows_bf16<<<dtk_blocks((size_t)C), DTK_THREADS, 0, s>>>(dx, dout, rows, n, C);
    else dtk_scatter_add_rows_f32<<<dtk_blocks((size_t)C), DTK_THREADS, 0, s>>>(dx, dout, rows, n, C);
    return cudaGetLastError();
}
