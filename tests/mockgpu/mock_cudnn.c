/* mock_cudnn.c — libcudnn.so.9 (src/ops/cudnn_att.cpp opens it with dlopen) on the mock GPU: a
 * cuDNN that loads, reports the version of the cudnn.h it is built against, and cannot make a
 * handle, as on a machine whose driver or GPU cuDNN does not support. The CUDA backend must then
 * run attention on its own kernels, saying why once (run-test.sh checks both). Nothing else of
 * cuDNN is modelled: the fused attention itself runs only on a real GPU (test_ops_backends). */
#include <cudnn.h>

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    *handle = 0;
    return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    (void)handle;
    return CUDNN_STATUS_BAD_PARAM; /* no handle was ever made */
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    (void)handle, (void)stream;
    return CUDNN_STATUS_BAD_PARAM;
}

const char *cudnnGetErrorString(cudnnStatus_t status) {
    return status == CUDNN_STATUS_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED (the mock GPU has no cuDNN)"
                                                : "a cuDNN error (mock)";
}
