// adamw.cu — the AdamW step (torch.optim.AdamW, as src/ops/ops_cpu.c computes it) over every
// piece of the parameters in one launch, with an optional bf16 copy of the updated parameters
// written in the same pass.
#include <math.h>

#include "dtk.h"
#include "dtk_common.cuh"

// The CPU reference (compiled without FMA contraction) rounds every product and sum; the
// explicit __fmul_rn/__fadd_rn/__fdiv_rn keep nvcc from fusing them, so with IEEE sqrtf
// the update is bit-identical to the CPU's for the same inputs.
// Element i of the flattened pieces: the last piece whose start is <= i (binary search in the
// table; the pieces are few, a few hundred at most, and the table stays in cache).
static __global__ void dtk_adamw_kernel(float *p, __nv_bfloat16 *p16, const float *g, float *m, float *v,
                                    const dtk_adamw_piece *pieces, int n_pieces, size_t total, float beta1, float beta2,
                                    float eps, float step_size, float bc2_sqrt, float decay_on) {
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = n_pieces - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (pieces[mid].start <= i) lo = mid;
            else hi = mid - 1;
        }
        const dtk_adamw_piece pc = pieces[lo];
        const size_t j = pc.offset + (i - pc.start), k = pc.moff + (i - pc.start);
        const float decay = pc.decay ? decay_on : 1.0f;
        const float gi = g[j];
        const float mi = __fadd_rn(__fmul_rn(beta1, m[k]), __fmul_rn(omb1, gi));                // b1 m + (1-b1) g
        const float vi = __fadd_rn(__fmul_rn(beta2, v[k]), __fmul_rn(__fmul_rn(omb2, gi), gi)); // b2 v + (1-b2) g g
        m[k] = mi;
        v[k] = vi;
        // p * decay - step_size * m / (sqrt(v) / sqrt(bc2) + eps)
        const float denom = __fadd_rn(__fdiv_rn(sqrtf(vi), bc2_sqrt), eps);
        const float pi = __fsub_rn(__fmul_rn(p[j], decay), __fdiv_rn(__fmul_rn(step_size, mi), denom));
        p[j] = pi;
        if (p16) p16[j] = __float2bfloat16_rn(pi);
    }
}

extern "C" cudaError_t dtk_adamw(cudaStream_t s, float *p, dtk_bf16 *p16, const float *g, float *m, float *v,
                                 const dtk_adamw_piece *pieces, int n_pieces, size_t total, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int t) {
    if (total == 0 || n_pieces <= 0) return cudaSuccess;
    // bias corrections in double on the host, rounded to float exactly as the CPU does
    const double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = 1.0f - lr * weight_decay;
    dtk_adamw_kernel<<<dtk_blocks(total), DTK_THREADS, 0, s>>>(p, p16, g, m, v, pieces, n_pieces, total, beta1, beta2, eps,
                                                           step_size, bc2_sqrt, decay);
    return cudaGetLastError();
}
