// probe.cu — the smallest kernel: proves the toolchain, the driver and the device work
// (ops_cuda.c's probe: doctor and test_cuda_probe).
#include "dtk.h"

__global__ static void dtk_probe_kernel(int *out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *out = 42;
}

extern "C" cudaError_t dtk_probe(cudaStream_t s, int *out) {
    dtk_probe_kernel<<<1, 32, 0, s>>>(out);
    return cudaGetLastError();
}
