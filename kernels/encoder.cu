// encoder.cu — token + position embedding (or the token's alone, without wpe): dtk_encoder_fwd
// and the deterministic dtk_encoder_bwd (dwpe, where there is one, summed over b in order; dwte
// through a stable sort of the tokens, so every dwte row adds its dout rows in increasing (b,t)
// order, as the CPU does).
#include <cub/device/device_radix_sort.cuh>

#include "dtk.h"
#include "dtk_common.cuh"

// One block per (b,t) row, threads over the C columns; wpe NULL: the token embedding alone.
template <typename A>
static __device__ void encoder_fwd(void *out, const int *tokens, const float *wte, const float *wpe, int T, int C) {
    const int bt = blockIdx.x, t = bt % T;
    const float *e = wte + (size_t)tokens[bt] * C, *p = wpe ? wpe + (size_t)t * C : nullptr;
    A *o = (A *)out + (size_t)bt * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dtk_st(o, c, p ? e[c] + p[c] : e[c]);
}
DTK_ACT_KERNELS(encoder_fwd, (void *out, const int *tokens, const float *wte, const float *wpe, int T, int C),
                (out, tokens, wte, wpe, T, C))

extern "C" cudaError_t dtk_encoder_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const float *wte,
                                       const float *wpe, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_encoder_fwd_bf16<<<B * T, DTK_THREADS, 0, s>>>(out, tokens, wte, wpe, T, C);
    else dtk_encoder_fwd_f32<<<B * T, DTK_THREADS, 0, s>>>(out, tokens, wte, wpe, T, C);
    return cudaGetLastError();
}

// dwpe[t,c] += dout[0,t,c] + dout[1,t,c] + ... in increasing b. With tc = t*C + c the
// element of batch b is dout[b*T*C + tc].
template <typename A> static __device__ void dwpe_sum(float *dwpe, const void *dout_, int B, size_t TC) {
    const A *dout = (const A *)dout_;
    for (size_t tc = (size_t)blockIdx.x * blockDim.x + threadIdx.x; tc < TC; tc += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[tc];
        for (int b = 0; b < B; b++) acc += dtk_ld(dout, (size_t)b * TC + tc);
        dwpe[tc] = acc;
    }
}
DTK_ACT_KERNELS(dwpe_sum, (float *dwpe, const void *dout, int B, size_t TC), (dwpe, dout, B, TC))

static __global__ void dtk_iota_kernel(int *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}

// keys: the tokens sorted (stable); idx: their original (b,t) positions. Block x looks at
// sorted position i; only the first position of a run of equal tokens does work: its
// threads (columns, strided over grid.y) add the run's dout rows into the token's dwte row
// in sorted order, which the stable sort made increasing (b,t) order.
template <typename A>
static __device__ void dwte_runs(float *dwte, const void *dout_, const int *keys, const int *idx, int BT, int C) {
    const A *dout = (const A *)dout_;
    const int i = blockIdx.x, tok = keys[i];
    if (i > 0 && keys[i - 1] == tok) return;
    float *d = dwte + (size_t)tok * C;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
        float acc = d[c];
        for (int j = i; j < BT && keys[j] == tok; j++) acc += dtk_ld(dout, (size_t)idx[j] * C + c);
        d[c] = acc;
    }
}
DTK_ACT_KERNELS(dwte_runs, (float *dwte, const void *dout, const int *keys, const int *idx, int BT, int C),
                (dwte, dout, keys, idx, BT, C))

// CUB's scratch for sorting n (int key, int value) pairs; asks the runtime for the device's
// PTX version (no GPU work). 0 on failure.
static size_t sort_temp_bytes(int n) {
    size_t bytes = 0;
    if (cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int *)nullptr, (int *)nullptr, (const int *)nullptr,
                                        (int *)nullptr, n) != cudaSuccess)
        return 0;
    return bytes;
}

// work = [sorted keys | positions (iota) | sorted positions | CUB scratch], each 256-aligned
extern "C" size_t dtk_encoder_bwd_work_bytes(int B, int T) {
    if (B <= 0 || T <= 0) return 0;
    const int BT = B * T;
    const size_t temp = sort_temp_bytes(BT);
    if (temp == 0) return 0;
    return 3 * dtk_align((size_t)BT * sizeof(int)) + dtk_align(temp);
}

extern "C" cudaError_t dtk_encoder_bwd(cudaStream_t s, dtk_type t, float *dwte, float *dwpe, const void *dout,
                                       const int *tokens, int B, int T, int C, void *work, size_t work_bytes) {
    if (B <= 0 || T <= 0 || C <= 0) return cudaSuccess;
    const int BT = B * T;
    const size_t arr = dtk_align((size_t)BT * sizeof(int));
    size_t temp = sort_temp_bytes(BT);
    if (temp == 0 || work == nullptr || work_bytes < 3 * arr + dtk_align(temp)) return cudaErrorInvalidValue;
    char *w = (char *)work;
    int *keys = (int *)w, *pos = (int *)(w + arr), *idx = (int *)(w + 2 * arr);
    void *cub_temp = w + 3 * arr;

    const size_t TC = (size_t)T * C;
    cudaError_t e;
    if (dwpe) { // no learned positions (wpe NULL): nothing to add
        if (t == DTK_BF16) dtk_dwpe_sum_bf16<<<dtk_blocks(TC), DTK_THREADS, 0, s>>>(dwpe, dout, B, TC);
        else dtk_dwpe_sum_f32<<<dtk_blocks(TC), DTK_THREADS, 0, s>>>(dwpe, dout, B, TC);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    dtk_iota_kernel<<<dtk_blocks((size_t)BT), DTK_THREADS, 0, s>>>(pos, BT);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    // SortPairs is a stable LSD radix sort: equal tokens keep increasing positions
    e = cub::DeviceRadixSort::SortPairs(cub_temp, temp, tokens, keys, pos, idx, BT, 0, (int)(8 * sizeof(int)), s);
    if (e != cudaSuccess) return e;
    const unsigned col_blocks = (unsigned)((C + DTK_THREADS - 1) / DTK_THREADS);
    const dim3 grid((unsigned)BT, col_blocks < 65535u ? col_blocks : 65535u);
    if (t == DTK_BF16) dtk_dwte_runs_bf16<<<grid, DTK_THREADS, 0, s>>>(dwte, dout, keys, idx, BT, C);
    else dtk_dwte_runs_f32<<<grid, DTK_THREADS, 0, s>>>(dwte, dout, keys, idx, BT, C);
    return cudaGetLastError();
}
