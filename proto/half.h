/* Conversions between binary32 and the two 16-bit floats, shared by the
 * daemon's reductions (daemon/reduce.c) and the client's 1-bit Adam
 * (client/adam_kernels.c), so that both round alike: fp32 -> fp16 and
 * fp32 -> bf16 round to nearest, ties to even (as torch's .half() and
 * .bfloat16()); NaN stays NaN, quiet, with the payload bits that fit;
 * fp16/bf16 -> fp32 is exact.
 *
 * Pure arithmetic, no allocation, no libuv. */
#ifndef OBCOMM_HALF_H
#define OBCOMM_HALF_H

#include <stdint.h>
#include <string.h>

/* Bit patterns of floats. memcpy is the portable way to type-pun; gcc turns
 * it into a register move. */
static inline uint32_t obcomm_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float obcomm_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
 * binary32: 1 sign, 8 exponent (bias 127), 23 mantissa bits. */
static inline float obcomm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;

    if (exp == 0) {
        /* Zero or subnormal: the value is mant * 2^-24. Both factors and
         * the product are exact in fp32 (the product is a normal fp32), so
         * this is exact under any rounding mode and with flush-to-zero. */
        return obcomm_f32_from_bits(sign |
                                    obcomm_f32_bits((float)mant * 0x1p-24f));
    }
    if (exp == 31) {
        /* Inf, or NaN: keep the payload and set the quiet bit. */
        uint32_t quiet = mant != 0 ? 0x400000u : 0;
        return obcomm_f32_from_bits(sign | 0x7f800000u | (mant << 13) | quiet);
    }
    return obcomm_f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t obcomm_f32_to_f16(float f)
{
    uint32_t x = obcomm_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t a = x & 0x7fffffffu;

    if (a > 0x7f800000u) {
        /* NaN: quiet, with the top payload bits that fit. */
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    }
    if (a >= 0x47800000u) {
        /* |f| >= 65536 (or Inf): beyond even the rounding range. */
        return (uint16_t)(sign | 0x7c00);
    }
    if (a >= 0x38800000u) {
        /* Normal half range [2^-14, 65536): rebias the exponent by
         * 127 - 15 = 112 and round the 13 dropped mantissa bits to nearest
         * even. A carry out of the mantissa correctly bumps the exponent,
         * up to 0x7c00 (Inf) for values >= 65520. */
        uint32_t r = a - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) {
        /* |f| < 2^-25, less than half the smallest subnormal: zero. */
        return (uint16_t)sign;
    }
    /* Subnormal half (or the smallest normal after rounding up): the
     * result is |f| / 2^-24 rounded to an integer, nearest even. With
     * |f| = m * 2^(e - 150) for the 24-bit significand m, that is
     * m >> (126 - e) with round-to-nearest-even on the dropped bits. */
    uint32_t e = a >> 23; /* 102 .. 112 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    r += (rem > half) | ((rem == half) & r);
    return (uint16_t)(sign | r);
}

/* bfloat16 is the top half of a binary32. */
static inline float obcomm_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((h & 0x7fff) > 0x7f80) {
        x |= 0x400000u; /* NaN: set the quiet bit */
    }
    return obcomm_f32_from_bits(x);
}

static inline uint16_t obcomm_f32_to_bf16(float f)
{
    uint32_t x = obcomm_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40); /* NaN: quiet, keep payload */
    }
    /* Round the low 16 bits to nearest even. A carry bumps the exponent;
     * from the largest finite values it lands exactly on Inf. NaN is out
     * of the way, so the sum cannot overflow 32 bits. */
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
