// dtk_common.cuh — helpers shared by the kernels in kernels/*.cu: launch sizes and
// deterministic warp/block reductions (fixed butterfly trees, no atomics).
#ifndef DTRAIN_DTK_COMMON_CUH
#define DTRAIN_DTK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <string.h>

#define DTK_THREADS 256                       // block size of the element-wise and column kernels
#define DTK_MAX_BLOCKS 8192                   // cap for grid-stride kernels (a few waves on an H100/H200)
#define DTK_WORK_ALIGN 256                    // alignment of each sub-buffer carved out of `work`
#define DTK_ROWS_PER_BLOCK (DTK_THREADS / 32) // row kernels that run one warp per row

// Blocks for a grid-stride loop over n > 0 elements.
static inline unsigned dtk_blocks(size_t n) {
    const size_t b = (n + DTK_THREADS - 1) / DTK_THREADS;
    return (unsigned)(b < DTK_MAX_BLOCKS ? b : DTK_MAX_BLOCKS);
}

static inline size_t dtk_align(size_t bytes) { return (bytes + DTK_WORK_ALIGN - 1) / DTK_WORK_ALIGN * DTK_WORK_ALIGN; }

// Activations are float or bf16 (dtk.h dtk_type): kernels that read or write them are
// templates over the element A, computing in float; dtk_ld widens an element (exactly),
// dtk_st rounds a float into one (round to nearest even for bf16). For float both are plain
// loads and stores, so the float kernels' arithmetic is what it was.
__device__ inline float dtk_ld(const float *p, size_t i) { return p[i]; }
__device__ inline float dtk_ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ inline void dtk_st(float *p, size_t i, float v) { p[i] = v; }
__device__ inline void dtk_st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// 16-byte accesses of 8 bf16 elements (p 16-byte aligned: dtk_aligned16), widened or rounded as
// dtk_ld and dtk_st; the halves move through memcpy between locals, so that nothing is read
// through another type's pointer (which the mock GPU's host compiler may miscompile).
__device__ inline void dtk_ld8(const __nv_bfloat16 *p, float f[8]) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    unsigned short h[8];
    memcpy(h, &u, sizeof u);
    for (int i = 0; i < 8; i++) f[i] = __bfloat162float(__ushort_as_bfloat16(h[i]));
}
__device__ inline void dtk_st8(__nv_bfloat16 *p, const float f[8]) {
    unsigned short h[8];
    for (int i = 0; i < 8; i++) h[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f[i]));
    uint4 u;
    memcpy(&u, h, sizeof u);
    *reinterpret_cast<uint4 *>(p) = u;
}
static inline bool dtk_aligned16(const void *p) { return (reinterpret_cast<size_t>(p) & 15) == 0; }

// Two plain-named kernels, dtk_NAME_f32 and dtk_NAME_bf16, around the template body NAME<A> (a
// __device__ function whose activation parameters are void pointers it casts to A): PARAMS is
// the parameter list, ARGS the arguments. Launch sites name a plain kernel, one of the two
// (tests/mockgpu rewrites `name<<<...>>>(`). Every kernel of ours is named dtk_...: that is how
// gpu-check.sh's compute-sanitizer steps pick ours out of cuBLASLt's and cuDNN's.
#define DTK_ACT_KERNELS(NAME, PARAMS, ARGS)                                                                            \
    static __global__ void dtk_##NAME##_f32 PARAMS { NAME<float> ARGS; }                                               \
    static __global__ void dtk_##NAME##_bf16 PARAMS { NAME<__nv_bfloat16> ARGS; }

struct DtkSum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct DtkMax {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly (xor) reduction over the 32 lanes of a full warp. Every lane ends with the
// same bits: at each level lanes l and l^m combine the same two values, and + and fmaxf
// are commutative.
template <typename T, typename Op> __device__ inline T dtk_warp_reduce(T v, Op op) {
    for (int m = 16; m > 0; m >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. Must be reached by all threads of the block. Safe to call repeatedly:
// the leading barrier keeps a new call from overwriting `part` while an earlier call is
// still reading it.
template <typename T, typename Op> __device__ inline T dtk_block_reduce(T v, Op op, T identity) {
    __shared__ T part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = dtk_warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : identity;
    return dtk_warp_reduce(v, op);
}

#endif
