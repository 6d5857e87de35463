/* cuda_ok.h — for the tests that call the CUDA runtime themselves (test_comm_nccl.c,
 * mockgpu/test_nccl_ranks.c): a failed call prints where and why, and the test exits 1. */
#ifndef DTRAIN_TESTS_CUDA_OK_H
#define DTRAIN_TESTS_CUDA_OK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_OK(call)                                                                                         \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

#endif
