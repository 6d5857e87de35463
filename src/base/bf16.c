/* bf16.c — bfloat16 arrays (include/dtrain/bf16.h): the loops of the inline conversions, built
 * with -O3 (CMakeLists.txt) so that they vectorise, and on x86-64 with GCC an AVX-512 copy (GCC
 * 12 and later: mask compares, and word permutes that narrow 32 lanes at once) and an AVX2 copy
 * that the loader picks on CPUs that have them (SSE2 alone has no cheap 32 -> 16-bit narrowing:
 * there the rounding loop is scalar). The same bits every way: integer arithmetic only
 * (test_ops_cpu's test_bf16_arrays). */
#include "dtrain/bf16.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12
/* x86-64-v4 (AVX-512 F, BW, DQ, VL: GCC 12 clones by level): "avx512f" alone keeps the AVX2 loop */
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

CLONES void dt_bf16_pack(uint16_t *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dt_float_to_bf16(src[i]);
}

CLONES void dt_bf16_unpack(float *restrict dst, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_float(src[i]);
}

CLONES void dt_bf16_add(float *restrict acc, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += dt_bf16_to_float(src[i]);
}

CLONES void dt_bf16_round_all(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = dt_bf16_round(x[i]);
}
