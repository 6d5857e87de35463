// rope.cu — rotary positions (RoPE, Hugging Face's rotate-half convention) on the q and k heads
// of the qkv activation, in place: forward (sign 1) and backward (sign -1, the rotation by -a)
// are one kernel.
#include "dtk.h"
#include "dtk_common.cuh"

#define ROPE_MAX_HALF 512 // hs <= 1024 (the model checks)

// One block per (b,t) row: its angles' cosines and sines first (cosf, sinf: accurate, not the
// __ intrinsics; a = (float)pos * inv_freq[i], one rounding, as on the CPU), then threads over
// the (head, i) pairs of the NH + NKV q and k heads, which are contiguous in the row.
template <typename A>
static __device__ void rope(void *qkv, const float *inv_freq, int pos0, dtk_att_shape a, float sign) {
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    const int bt = blockIdx.x, half = a.hs / 2, pairs = (a.NH + a.NKV) * half;
    const float pos = (float)(a.pos ? a.pos[bt] : pos0 + bt % a.T);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float ang = pos * inv_freq[i];
        cs[i] = cosf(ang);
        sn[i] = sign * sinf(ang);
    }
    __syncthreads();
    A *row = (A *)qkv + (size_t)bt * (a.NH + 2 * a.NKV) * a.hs;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int h = p / half, i = p - h * half;
        const size_t k1 = (size_t)h * a.hs + i, k2 = k1 + half;
        const float x1 = dtk_ld(row, k1), x2 = dtk_ld(row, k2);
        dtk_st(row, k1, __fsub_rn(__fmul_rn(x1, cs[i]), __fmul_rn(x2, sn[i])));
        dtk_st(row, k2, __fadd_rn(__fmul_rn(x2, cs[i]), __fmul_rn(x1, sn[i])));
    }
}
DTK_ACT_KERNELS(rope, (void *qkv, const float *inv_freq, int pos0, dtk_att_shape a, float sign),
                (qkv, inv_freq, pos0, a, sign))

extern "C" cudaError_t dtk_rope(cudaStream_t s, dtk_type t, void *qkv, const float *inv_freq, int pos0,
                                dtk_att_shape a, float sign) {
    if (a.B <= 0 || a.T <= 0 || a.hs < 2 || a.NH <= 0 || a.NKV < 0) return cudaSuccess;
    if (a.hs / 2 > ROPE_MAX_HALF) return cudaErrorInvalidValue;
    if (t == DTK_BF16) dtk_rope_bf16<<<a.B * a.T, DTK_THREADS, 0, s>>>(qkv, inv_freq, pos0, a, sign);
    else dtk_rope_f32<<<a.B * a.T, DTK_THREADS, 0, s>>>(qkv, inv_freq, pos0, a, sign);
    return cudaGetLastError();
}
