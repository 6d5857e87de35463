// probe.cu — the smallest kernel: proves the toolchain, the driver and the device work.
#include <cuda_runtime.h>

extern "C" {
#include "dtrain/status.h"
}

__global__ static void dt_probe_kernel(int *out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *out = 42;
}

#define CUDA_PROBE_CHECK(call)                                                                  \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            st = dt_error_set(DT_ERR_DEVICE, "%s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                              cudaGetErrorString(e_));                                          \
            goto done;                                                                          \
        }                                                                                       \
    } while (0)

extern "C" dt_status dt_cuda_probe(int device) {
    dt_status st = DT_OK;
    int *d = NULL, h = 0;
    CUDA_PROBE_CHECK(cudaSetDevice(device));
    CUDA_PROBE_CHECK(cudaMalloc(&d, sizeof(int)));
    dt_probe_kernel<<<1, 32>>>(d);
    CUDA_PROBE_CHECK(cudaGetLastError());
    CUDA_PROBE_CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
    if (h != 42) st = dt_error_set(DT_ERR_DEVICE, "probe kernel on device %d wrote %d, expected 42", device, h);
done:
    if (d) cudaFree(d);
    return st;
}
