/* mock_api.h — what libmockcuda.so (mock_cuda.c) offers beyond the CUDA runtime API: the
 * kernel executor behind the emulated launches of emu/cuda_runtime.h, and the error
 * reporting, stream work and pointer checks the cuBLASLt, CUB and NCCL stand-ins share. Not
 * a CUDA API. */
#ifndef MOCK_API_H
#define MOCK_API_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
/* threadIdx, blockIdx, blockDim, gridDim of the CUDA thread running now */
struct emu_uint3 { unsigned x, y, z; };
extern struct emu_uint3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
/* warp shuffle exchange: one slot per thread of the block */
extern double emu_xbuf[1024];

/* Prints "MOCK ERROR: ..." to stderr and counts it; the process exits 1 at exit when any
 * error was reported (MOCK_ABORT=1: abort at once, for a core dump or a debugger). */
void mock_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 0 when [p, p + bytes) lies inside one device (or managed) allocation; else reports `what`,
 * returns 1. */
int mock_check_dev_range(const void *p, size_t bytes, const char *what);
/* Runs fn(arg) on `stream` in stream order (library work: cuBLASLt products, CUB sorts, NCCL
 * collectives); `name` says whose (the profiler log, MOCK_PROFILER_LOG). */
void mock_enqueue_fn(void *stream, const char *name, void (*fn)(void *), void *arg);
/* A kernel launch: validates the configuration, queues body(closure) for every thread of
 * every block on `stream`; destroy(closure) after the last. */
void mock_kernel_launch(const char *name, const unsigned g[3], const unsigned b[3], size_t shmem, void *stream,
                        void (*body)(void *), void *closure, void (*destroy)(void *));
/* Work queued so far: kernel launches, and library work (cuBLASLt products, CUB, NCCL). */
void mock_launch_counts(unsigned long *kernels, unsigned long *library);
/* Synchronisations so far: every call that made the host wait for the device (cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy, a copy into pageable memory) */
unsigned long mock_sync_count(void);
/* bytes of device memory allocated now (test_ops_backends' memory case) */
size_t mock_device_in_use(void);
/* Pointer argument `argi` of a launch: NULL or device memory, else reported. */
void mock_check_kernel_ptr(const char *kname, int argi, const void *p);
/* __syncthreads() and the barrier inside every warp shuffle */
void emu_syncthreads(const char *bar); /* bar: "file:line" of the __syncthreads */
void emu_warp_sync(unsigned mask);
#ifdef __cplusplus
}
#endif
#endif
