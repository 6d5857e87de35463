// argmax.cu — row argmax (predictions for accuracy, so the host never copies the logits)
// and the bias add used when cuBLASLt has no bias epilogue for a shape. Owned by ops_cuda.c.
#include "dtk.h"
#include "dtk_common.cuh"

// One block per row: each thread scans a strided slice keeping its best (value, column);
// the block then reduces pairs, preferring the smaller column on equal values so the
// result is the first maximum, as on the CPU.
template <typename A> static __device__ void argmax(int *idx, const void *x, int V, int ld) {
    const A *r = (const A *)x + (size_t)blockIdx.x * ld;
    float best = -INFINITY;
    int arg = 0x7fffffff;
    for (int k = threadIdx.x; k < V; k += blockDim.x) {
        float v = dtk_ld(r, k);
        if (v > best || (v == best && k < arg)) { best = v; arg = k; }
    }
    __shared__ float sv[256];
    __shared__ int si[256];
    sv[threadIdx.x] = best;
    si[threadIdx.x] = arg;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            float ov = sv[threadIdx.x + half];
            int oi = si[threadIdx.x + half];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    // The CPU keeps column 0 while nothing compares greater than x[0]: a NaN in column 0 (then
    // nothing ever does) or a row of NaNs gives 0; NaNs elsewhere are skipped, as here.
    if (threadIdx.x == 0) {
        const float r0 = dtk_ld(r, 0);
        idx[blockIdx.x] = si[0] == 0x7fffffff || r0 != r0 ? 0 : si[0];
    }
}
DTK_ACT_KERNELS(argmax, (int *idx, const void *x, int V, int ld), (idx, x, V, ld))

extern "C" cudaError_t dtk_argmax(cudaStream_t s, dtk_type t, int *idx, const void *x, int N, int V, int ld) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_argmax_bf16<<<N, 256, 0, s>>>(idx, x, V, ld);
    else dtk_argmax_f32<<<N, 256, 0, s>>>(idx, x, V, ld);
    return cudaGetLastError();
}

template <typename A> static __device__ void add_bias(void *out_, const float *bias, size_t total, int N, int add) {
    A *out = (A *)out_;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        dtk_st(out, i, add ? dtk_ld(out, i) + bias[i % (size_t)N] : bias[i % (size_t)N]);
}
DTK_ACT_KERNELS(add_bias, (void *out, const float *bias, size_t total, int N, int add), (out, bias, total, N, add))

extern "C" cudaError_t dtk_add_bias(cudaStream_t s, dtk_type t, void *out, const float *bias, int M, int N, int add) {
    size_t total = (size_t)M * (size_t)N;
    if (total == 0) return cudaSuccess;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    if (t == DTK_BF16) dtk_add_bias_bf16<<<(unsigned)blocks, 256, 0, s>>>(out, bias, total, N, add);
    else dtk_add_bias_f32<<<(unsigned)blocks, 256, 0, s>>>(out, bias, total, N, add);
    return cudaGetLastError();
}
