/* bf16.h — bfloat16 on the host: its 16 bits from a float (round to nearest, ties to even, as
 * CUDA's __float2bfloat16_rn; NaN stays NaN) and back (exact). */
#ifndef DTRAIN_BF16_H
#define DTRAIN_BF16_H

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
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet, keeps the sign */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f rounded to bf16 and back */
static inline float dt_bf16_round(float f) { return dt_bf16_to_float(dt_float_to_bf16(f)); }

#endif
