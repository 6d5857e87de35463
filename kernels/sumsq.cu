// sumsq.cu — sums in double. The sum of squares (the global gradient norm) over a table of
// ranges (all the gradients, or a shard's buckets): a fixed number of blocks, chosen from the
// total only, each reduce a fixed grid-stride slice of every range in turn into `work`; one
// block then adds the partials. The tree depends on the ranges alone, so the result is the same
// bits on every run and every GPU model. The training loss: one block adds a micro-batch's
// per-row losses onto the step's sum, on the device.
#include "dtk.h"
#include "dtk_common.cuh"

#define SUMSQ_MAX_BLOCKS 1024

static unsigned sumsq_blocks(size_t n) {
    const size_t b = (n + DTK_THREADS - 1) / DTK_THREADS;
    return (unsigned)(b < SUMSQ_MAX_BLOCKS ? b : SUMSQ_MAX_BLOCKS);
}

static __global__ void dtk_sumsq_partial_kernel(double *part, const float *x, const dtk_range *ranges, int n_ranges) {
    double acc = 0.0;
    for (int r = 0; r < n_ranges; r++) {
        const float *y = x + ranges[r].offset;
        const size_t n = ranges[r].numel;
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
            acc += (double)y[i] * y[i];
    }
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
extern "C" size_t dtk_sumsq_work_bytes(size_t total) {
    return total ? dtk_align(sumsq_blocks(total) * sizeof(double)) : 0;
}

extern "C" cudaError_t dtk_sumsq(cudaStream_t s, double *out, const float *x, const dtk_range *ranges, int n_ranges,
                                 size_t total, void *work, size_t work_bytes) {
    if (total == 0) return cudaMemsetAsync(out, 0, sizeof(double), s); // the empty sum, without a kernel
    if (work == nullptr || work_bytes < dtk_sumsq_work_bytes(total)) return cudaErrorInvalidValue;
    const unsigned blocks = sumsq_blocks(total);
    double *part = (double *)work;
    dtk_sumsq_partial_kernel<<<blocks, DTK_THREADS, 0, s>>>(part, x, ranges, n_ranges);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dtk_sumsq_final_kernel<<<1, DTK_THREADS, 0, s>>>(out, part, blocks);
    return cudaGetLastError();
}

// One block: thread k adds rows k, k + blockDim, ... in order, then a block reduction; thread 0
// adds the sum to *acc (stream order keeps the micro-batches' additions in order)
static __global__ void dtk_loss_sum_kernel(double *acc, const float *losses, const int *targets, int n) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (targets == nullptr || targets[i] >= 0) sum += (double)losses[i];
    sum = dtk_block_reduce(sum, DtkSum(), 0.0);
    if (threadIdx.x == 0) *acc += sum;
}

extern "C" cudaError_t dtk_loss_sum(cudaStream_t s, double *acc, const float *losses, const int *targets, int n) {
    if (n <= 0) return cudaSuccess;
    dtk_loss_sum_kernel<<<1, DTK_THREADS, 0, s>>>(acc, losses, targets, n);
    return cudaGetLastError();
}
