/* ops_cuda.c — host side of the CUDA backend. Today: library versions; the op table for
 * GPU training arrives with the CUDA kernels (kernels/). */
#include "dtrain/cuda.h"

#include <stdio.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

void dt_cuda_versions(char *buf, size_t n) {
    int rt = 0, drv = 0, nccl = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    if (ncclGetVersion(&nccl) != ncclSuccess) nccl = 0;
    size_t lt = cublasLtGetVersion();
    size_t dnn = cudnnGetVersion();
    snprintf(buf, n,
             "CUDA runtime %d.%d (built with %d.%d, driver %d.%d), cuBLASLt %zu (built with %d), "
             "cuDNN %zu (built with %d), NCCL %d (built with %d)",
             rt / 1000, rt % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, drv / 1000,
             drv % 1000 / 10, lt, CUBLAS_VERSION, dnn, CUDNN_VERSION, nccl, NCCL_VERSION_CODE);
}
