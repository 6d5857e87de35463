// sumsq.cu — sum of squares in double (the global gradient norm): a fixed number of blocks,
// chosen from n only, each reduce a fixed grid-stride slice into `work`; one block then adds
// the partials. The tree depends on n alone, so the result is the same bits on every run
// and every GPU model.
#include "dtk.h"
#include "dtk_common.cuh"

#define SUMSQ_MAX_BLOCKS 1024

static unsigned sumsq_blocks(size_t n) {
    const size_t b = (n + DTK_THREADS - 1) / DTK_THREADS;
    return (unsigned)(b < SUMSQ_MAX_BLOCKS ? b : SUMSQ_MAX_BLOCKS);
}

static __global__ void dtk_sumsq_partial_kernel(double *part, const float *x, size_t n) {
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * x[i];
    acc = dtk_block_reduce(acc, DtkSum(), 0.0);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// One block: thread k sums partials k, k + blockDim, ... in order, then a block reduction.
static __global__ void dtk_sumsq_final_kernel(double *out, const double *part, unsigned nparts) {
    double acc = 0.0;
    for (unsigned k = threadIdx.x; k < nparts; k += blockDim.x) acc += part[k];
    acc = dtk_block_reduce(acc, DtkSum(), 0.0);
    if (threadIdx.x == 0) *out = acc;
}

// work = one double per block of the first pass
extern "C" size_t dtk_sumsq_work_bytes(size_t n) { return n ? dtk_align(sumsq_blocks(n) * sizeof(double)) : 0; }

extern "C" cudaError_t dtk_sumsq(cudaStream_t s, double *out, const float *x, size_t n, void *work, size_t work_bytes) {
    if (n == 0) return cudaMemsetAsync(out, 0, sizeof(double), s); // the empty sum, without a kernel
    if (work == nullptr || work_bytes < dtk_sumsq_work_bytes(n)) return cudaErrorInvalidValue;
    const unsigned blocks = sumsq_blocks(n);
    double *part = (double *)work;
    dtk_sumsq_partial_kernel<<<blocks, DTK_THREADS, 0, s>>>(part, x, n);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dtk_sumsq_final_kernel<<<1, DTK_THREADS, 0, s>>>(out, part, blocks);
    return cudaGetLastError();
}
