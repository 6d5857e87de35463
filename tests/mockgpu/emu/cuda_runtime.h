// cuda_runtime.h (emulated) — found before the real one when kernels/*.cu are compiled as host
// C++ for the mock GPU (Makefile): the real cuda_runtime_api.h supplies the types, error
// codes and runtime functions (served by libmockcuda.so); this header adds the CUDA C++ that
// a host compiler lacks, executed by mock_cuda.c:
//   - __global__/__device__/__host__ are plain functions, __shared__ variables are statics
//     (one kernel runs at a time);
//   - threadIdx, blockIdx, blockDim, gridDim are the executor's globals;
//   - __syncthreads() and __shfl_xor_sync() are real barriers (the block's threads are fibers);
//   - __fmul_rn and friends are the host's IEEE operations (with -ffp-contract=off);
//   - atomicAdd on an unsigned, __threadfence and __ldcg (see below);
//   - the Makefile rewrites kernel<<<g, b, sh, s>>>(args) into
//     emu_launcher("kernel", kernel, g, b, sh, s)(args): a checked, queued launch.
// Deliberately missing (a kernel that uses one does not compile, which is the signal to add
// it here and to mock_cuda.c): other shuffles and warp votes, __syncwarp, atomics other than an
// unsigned atomicAdd, textures,
// cooperative groups, template kernels in a launch (the rewrite matches a plain name). A
// launch with dynamic shared memory is reported by mock_cuda.c.
#pragma once
// the qualifiers before the real headers, which define only those not yet defined
#define __global__
#define __device__
#define __host__
#define __shared__ static
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <math.h>
#include <tuple>
#include <type_traits>

#include "mock_api.h"

template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }

#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#define EMU_STR2(x) #x
#define EMU_STR(x) EMU_STR2(x)
#define __syncthreads() emu_syncthreads(__FILE__ ":" EMU_STR(__LINE__))
using std::max;
using std::min;

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(double), "shuffle of a type larger than 8 bytes");
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    std::memcpy(&emu_xbuf[tid], &v, sizeof(T));
    emu_warp_sync(mask); // every lane has written its value
    T r;
    std::memcpy(&r, &emu_xbuf[(tid & ~31u) | ((tid & 31u) ^ (unsigned)lane_mask)], sizeof(T));
    emu_warp_sync(mask); // every lane has read before the slots are reused
    return r;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
// Blocks run one after another and threads switch only at barriers, so an unsigned atomicAdd
// is a plain read-modify-write and a fence orders nothing that is not already ordered (kernels
// that count finished blocks, as the column reductions do, see every earlier block's writes;
// MOCK_ORDER=rev changes which block is last). __ldcg (a load that skips L1) is a load.
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
static inline void __threadfence() {}
template <typename T> static inline T __ldcg(const T *p) { return *p; }

// The launch: checks the pointer arguments now, runs every thread of every block later, in
// stream order, each on a copy of the arguments.
template <class... P> struct emu_launch_obj {
    void (*k)(P...);
    const char *name;
    dim3 g, b;
    size_t sh;
    cudaStream_t s;
    typedef std::tuple<void (*)(P...), std::decay_t<P>...> closure;
    static void body(void *c) { std::apply([](auto f, auto... a) { f(a...); }, *(closure *)c); }
    static void destroy(void *c) { delete (closure *)c; }
    template <class A> static void check(const char *n, int i, const A &a) {
        if constexpr (std::is_pointer_v<A>) mock_check_kernel_ptr(n, i, (const void *)a);
    }
    void operator()(P... args) const {
        int i = 0;
        (check(name, i++, args), ...);
        const unsigned gg[3] = {g.x, g.y, g.z}, bb[3] = {b.x, b.y, b.z};
        mock_kernel_launch(name, gg, bb, sh, (void *)s, body, new closure(k, args...), destroy);
    }
};
template <class... P>
static inline emu_launch_obj<P...> emu_launcher(const char *name, void (*k)(P...), dim3 g, dim3 b, size_t sh = 0,
                                                cudaStream_t s = 0) {
    return emu_launch_obj<P...>{k, name, g, b, sh, s};
}
