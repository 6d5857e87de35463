/* bf16.h — bfloat16 on the host: its 16 bits from a float (round to nearest, ties to even, as
 * CUDA's __float2bfloat16_rn; NaN stays NaN) and back (exact), one value inline or whole arrays
 * (src/base/bf16.c: vectorised, with an AVX2 clone picked at load time where the CPU has it). */
#ifndef DTRAIN_BF16_H
#define DTRAIN_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline float dt_bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t dt_float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u; /* NaN: quiet */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* f rounded to bf16 and back */
static inline float dt_bf16_round(float f) { return dt_bf16_to_float(dt_float_to_bf16(f)); }

/* dst(n) = bf16 of src(n) */
void dt_bf16_pack(uint16_t *dst, const float *src, size_t n);
/* dst(n) = src(n) as floats */
void dt_bf16_unpack(float *dst, const uint16_t *src, size_t n);
/* acc(n) += src(n) as floats */
void dt_bf16_add(float *acc, const uint16_t *src, size_t n);
/* x(n) = x(n) rounded to bf16 and back */
void dt_bf16_round_all(float *x, size_t n);

#endif
