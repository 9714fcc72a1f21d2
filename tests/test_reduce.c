/* Tests of daemon/reduce.c: exact results against naive per-element code.
 *
 * The references here are written independently of the implementation:
 * half-precision values come from ldexp() on the bit fields, rounding is
 * checked against a search for the nearest representable value, and the
 * reductions are plain per-element loops in source order.
 */
#include <check.h>

#include "ck_run.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"

/* Check records every passing ck_assert through a pipe to the runner, which
 * costs a system call each; loops over millions of values use EXPECT, which
 * calls into Check only on failure. */
#define EXPECT(cond, ...)              \
    do {                               \
        if (!(cond)) {                 \
            ck_abort_msg(__VA_ARGS__); \
        }                              \
    } while (0)

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float ffrom(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* xorshift64*: deterministic data for every run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1000, 1000). */
static double rng_real(void)
{
    return (double)(rng() >> 11) * 0x1p-53 * 2000.0 - 1000.0;
}

static int is_f16_nan(uint16_t h)
{
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

static int is_bf16_nan(uint16_t h)
{
    return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

/* The value of a binary16 bit pattern from its fields (not NaN). */
static double ref_f16_value(uint16_t h)
{
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    double v;
    if (exp == 0) {
        v = ldexp(mant, -24);
    } else if (exp == 31) {
        v = INFINITY;
    } else {
        v = ldexp(1024 + mant, exp - 25);
    }
    return (h & 0x8000) ? -v : v;
}

/* All non-negative finite values of a half format in bit-pattern order
 * (which is value order), followed by a sentinel: the value the next
 * pattern would have with an unbounded exponent (2^16 for fp16, 2^128 for
 * bf16), so that rounding to it means Inf. */
static double f16_vals[0x7c01];
static double bf16_vals[0x7f81];

static void init_tables(void)
{
    for (int h = 0; h < 0x7c00; h++) {
        f16_vals[h] = ref_f16_value((uint16_t)h);
    }
    f16_vals[0x7c00] = 65536.0;
    for (int h = 0; h < 0x7f80; h++) {
        bf16_vals[h] = (double)ffrom((uint32_t)h << 16);
    }
    bf16_vals[0x7f80] = ldexp(1.0, 128);
}

/* Round |d| to the nearest entry of vals (n entries including the
 * sentinel), ties to the even index; the index is the bit pattern. The
 * comparison is 2|d| against the sum of the two neighbours, both exact in
 * double. */
static uint16_t ref_nearest(double d, const double *vals, int n)
{
    double a = fabs(d);
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    if (a >= vals[n - 1]) {
        return (uint16_t)(sign | (n - 1));
    }
    int lo = 0, hi = n - 1; /* vals[lo] <= a < vals[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (vals[mid] <= a) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    double twice = 2.0 * a, sum = vals[lo] + vals[hi];
    int pick;
    if (twice < sum) {
        pick = lo;
    } else if (twice > sum) {
        pick = hi;
    } else {
        pick = (lo & 1) ? hi : lo;
    }
    return (uint16_t)(sign | pick);
}

/* ---- dtype and op metadata --------------------------------------------- */

START_TEST(test_dtype_info)
{
    ck_assert_uint_eq(obd_dtype_size(OBCOMM_FLOAT32), 4);
    ck_assert_uint_eq(obd_dtype_size(OBCOMM_FLOAT64), 8);
    ck_assert_uint_eq(obd_dtype_size(OBCOMM_FLOAT16), 2);
    ck_assert_uint_eq(obd_dtype_size(OBCOMM_BFLOAT16), 2);
    ck_assert_uint_eq(obd_dtype_size(OBCOMM_INT32), 4);
    ck_assert_uint_eq(obd_dtype_size(OBCOMM_INT64), 8);
    ck_assert_uint_eq(obd_dtype_size((obcomm_dtype_t)6), 0);
    ck_assert_uint_eq(obd_dtype_size((obcomm_dtype_t)-1), 0);

    ck_assert_uint_eq(obd_dtype_acc_size(OBCOMM_FLOAT32), 4);
    ck_assert_uint_eq(obd_dtype_acc_size(OBCOMM_FLOAT64), 8);
    ck_assert_uint_eq(obd_dtype_acc_size(OBCOMM_FLOAT16), 4);
    ck_assert_uint_eq(obd_dtype_acc_size(OBCOMM_BFLOAT16), 4);
    ck_assert_uint_eq(obd_dtype_acc_size(OBCOMM_INT32), 4);
    ck_assert_uint_eq(obd_dtype_acc_size(OBCOMM_INT64), 8);
    ck_assert_uint_eq(obd_dtype_acc_size((obcomm_dtype_t)42), 0);

    for (int d = -3; d < 10; d++) {
        ck_assert_int_eq(obd_dtype_valid(d), d >= 0 && d <= 5);
    }
    for (int o = -3; o < 10; o++) {
        ck_assert_int_eq(obd_op_valid(o), o >= 0 && o <= 3);
    }

    ck_assert_str_eq(obd_dtype_name(OBCOMM_FLOAT32), "float32");
    ck_assert_str_eq(obd_dtype_name(OBCOMM_FLOAT64), "float64");
    ck_assert_str_eq(obd_dtype_name(OBCOMM_FLOAT16), "float16");
    ck_assert_str_eq(obd_dtype_name(OBCOMM_BFLOAT16), "bfloat16");
    ck_assert_str_eq(obd_dtype_name(OBCOMM_INT32), "int32");
    ck_assert_str_eq(obd_dtype_name(OBCOMM_INT64), "int64");
    ck_assert_str_eq(obd_dtype_name((obcomm_dtype_t)6), "invalid");
    ck_assert_str_eq(obd_op_name(OBCOMM_SUM), "sum");
    ck_assert_str_eq(obd_op_name(OBCOMM_AVG), "avg");
    ck_assert_str_eq(obd_op_name(OBCOMM_MAX), "max");
    ck_assert_str_eq(obd_op_name(OBCOMM_MIN), "min");
    ck_assert_str_eq(obd_op_name((obcomm_op_t)4), "invalid");
}
END_TEST

/* ---- Conversions ------------------------------------------------------- */

/* Every fp16 pattern widens to its exact value and narrows back to itself;
 * NaN widens to a quiet NaN and narrows to a quiet NaN. */
START_TEST(test_f16_exhaustive)
{
    for (uint32_t u = 0; u < 0x10000; u++) {
        uint16_t h = (uint16_t)u;
        float f = obd_f16_to_f32(h);
        uint16_t back = obd_f32_to_f16(f);
        if (is_f16_nan(h)) {
            EXPECT(isnan(f), "0x%04x", u);
            EXPECT(fbits(f) & 0x400000, "0x%04x not quiet", u);
            EXPECT(is_f16_nan(back), "0x%04x -> 0x%04x", u, back);
            EXPECT(back & 0x200, "0x%04x -> 0x%04x not quiet", u, back);
            EXPECT((back & 0x8000) == (h & 0x8000), "0x%04x sign", u);
            continue;
        }
        double want = ref_f16_value(h);
        EXPECT((double)f == want, "0x%04x: %a != %a", u, (double)f, want);
        EXPECT(!!signbit(f) == !!(h & 0x8000), "0x%04x sign", u);
        EXPECT(back == h, "0x%04x -> 0x%04x", u, back);
    }
}
END_TEST

START_TEST(test_bf16_exhaustive)
{
    for (uint32_t u = 0; u < 0x10000; u++) {
        uint16_t h = (uint16_t)u;
        float f = obd_bf16_to_f32(h);
        uint16_t back = obd_f32_to_bf16(f);
        if (is_bf16_nan(h)) {
            EXPECT(isnan(f), "0x%04x", u);
            EXPECT(fbits(f) & 0x400000, "0x%04x not quiet", u);
            EXPECT(is_bf16_nan(back), "0x%04x -> 0x%04x", u, back);
            EXPECT(back & 0x40, "0x%04x -> 0x%04x not quiet", u, back);
            EXPECT((back & 0x8000) == (h & 0x8000), "0x%04x sign", u);
            continue;
        }
        EXPECT(fbits(f) == u << 16, "0x%04x", u);
        EXPECT(back == h, "0x%04x -> 0x%04x", u, back);
    }
}
END_TEST

/* Hand-picked rounding cases, fp32 input to expected fp16 bits. */
static const struct {
    float in;
    uint16_t want;
    const char *why;
} f16_cases[] = {
    {1.0f + 0x1p-11f, 0x3c00, "1 + 2^-11: tie between 1 and 1+2^-10 -> even"},
    {1.0f + 0x3p-11f, 0x3c02, "1 + 3*2^-11: tie -> 1+2^-9 (even)"},
    {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01, "just above the tie -> up"},
    {1.0f + 0x1p-11f - 0x1p-24f, 0x3c00, "just below the tie -> down"},
    {2049.0f, 0x6800, "2049: tie between 2048 and 2050 -> 2048"},
    {2051.0f, 0x6802, "2051: tie between 2050 and 2052 -> 2052"},
    {-2051.0f, 0xe802, "-2051 -> -2052"},
    {65504.0f, 0x7bff, "largest finite"},
    {65519.996f, 0x7bff, "just below 65520 -> 65504"},
    {65520.0f, 0x7c00, "65520: tie between 65504 and 2^16 -> Inf"},
    {-65520.0f, 0xfc00, "-65520 -> -Inf"},
    {1e10f, 0x7c00, "overflow -> Inf"},
    {3.4028235e38f, 0x7c00, "FLT_MAX -> Inf"},
    {INFINITY, 0x7c00, "Inf"},
    {-INFINITY, 0xfc00, "-Inf"},
    {0x1p-14f, 0x0400, "smallest normal"},
    {0x1p-24f, 0x0001, "smallest subnormal"},
    {0x3ffp-24f, 0x03ff, "largest subnormal"},
    {0x7ffp-25f, 0x0400, "1023.5 * 2^-24: tie -> 0x400 (even), normal"},
    {0x7fdp-25f, 0x03fe, "1022.5 * 2^-24: tie -> 0x3fe (even)"},
    {0x1p-25f, 0x0000, "2^-25: tie between 0 and 2^-24 -> 0"},
    {-0x1p-25f, 0x8000, "-2^-25 -> -0"},
    {0x1p-25f + 0x1p-40f, 0x0001, "just above 2^-25 -> 2^-24"},
    {0x3p-25f, 0x0002, "1.5 * 2^-24: tie -> 2 (even)"},
    {0x5p-25f, 0x0002, "2.5 * 2^-24: tie -> 2 (even)"},
    {0x1p-26f, 0x0000, "2^-26 -> 0"},
    {0x1p-149f, 0x0000, "fp32 subnormal -> 0"},
    {-0x1p-149f, 0x8000, "negative fp32 subnormal -> -0"},
    {0.0f, 0x0000, "+0"},
    {-0.0f, 0x8000, "-0"},
    {0.1f, 0x2e66, "0.1"},
    {-1.0f / 3.0f, 0xb555, "-1/3"},
};

START_TEST(test_f16_rounding_cases)
{
    for (size_t i = 0; i < sizeof(f16_cases) / sizeof(f16_cases[0]); i++) {
        uint16_t got = obd_f32_to_f16(f16_cases[i].in);
        ck_assert_msg(got == f16_cases[i].want, "%s: %a -> 0x%04x, want 0x%04x",
                      f16_cases[i].why, (double)f16_cases[i].in, got,
                      f16_cases[i].want);
    }
    ck_assert(is_f16_nan(obd_f32_to_f16(NAN)));
    ck_assert(is_f16_nan(obd_f32_to_f16(-NAN)));
    /* A signalling fp32 NaN whose payload lies below the fp16 bits. */
    uint16_t h = obd_f32_to_f16(ffrom(0x7f800001u));
    ck_assert(is_f16_nan(h) && (h & 0x200));
}
END_TEST

/* bf16 rounding cases, given as fp32 bit patterns. */
static const struct {
    uint32_t in;
    uint16_t want;
    const char *why;
} bf16_cases[] = {
    {0x3f808000, 0x3f80, "1 + 2^-8: tie between 1 and 1+2^-7 -> even"},
    {0x3f818000, 0x3f82, "1 + 3*2^-8: tie -> 1+2^-6 (even)"},
    {0x3f808001, 0x3f81, "just above the tie -> up"},
    {0x3f807fff, 0x3f80, "just below the tie -> down"},
    {0x7f7f7fff, 0x7f7f, "just below the top tie -> largest finite"},
    {0x7f7f8000, 0x7f80, "tie between largest finite and 2^128 -> Inf"},
    {0x7f7fffff, 0x7f80, "FLT_MAX -> Inf"},
    {0xff7fffff, 0xff80, "-FLT_MAX -> -Inf"},
    {0x7f800000, 0x7f80, "Inf"},
    {0x00008000, 0x0000, "fp32 subnormal tie -> 0 (even)"},
    {0x00018000, 0x0002, "fp32 subnormal tie -> 0x0002 (even)"},
    {0x00008001, 0x0001, "fp32 subnormal above tie -> up"},
    {0x007fffff, 0x0080, "largest fp32 subnormal -> smallest normal"},
    {0x80000000, 0x8000, "-0"},
    {0x3dcccccd, 0x3dcd, "0.1f"},
};

START_TEST(test_bf16_rounding_cases)
{
    for (size_t i = 0; i < sizeof(bf16_cases) / sizeof(bf16_cases[0]); i++) {
        uint16_t got = obd_f32_to_bf16(ffrom(bf16_cases[i].in));
        ck_assert_msg(got == bf16_cases[i].want,
                      "%s: 0x%08x -> 0x%04x, want 0x%04x", bf16_cases[i].why,
                      bf16_cases[i].in, got, bf16_cases[i].want);
    }
    ck_assert(is_bf16_nan(obd_f32_to_bf16(NAN)));
    /* A signalling NaN whose payload lies entirely in the dropped bits. */
    uint16_t h = obd_f32_to_bf16(ffrom(0xff800001u));
    ck_assert(is_bf16_nan(h) && (h & 0x40) && (h & 0x8000));
}
END_TEST

/* Every midpoint between adjacent half values, and the fp32 neighbours on
 * either side of it, against ref_nearest; both signs. */
START_TEST(test_half_midpoints)
{
    for (int k = 0; k < 0x7c00; k++) {
        float mid = (float)((f16_vals[k] + f16_vals[k + 1]) / 2);
        EXPECT((double)mid * 2 == f16_vals[k] + f16_vals[k + 1],
               "midpoint not exact, k = 0x%x", k);
        uint16_t even = (uint16_t)((k & 1) ? k + 1 : k);
        float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
        for (int neg = 0; neg < 2; neg++) {
            float s = neg ? -1.0f : 1.0f;
            uint16_t sign = neg ? 0x8000 : 0;
            EXPECT(obd_f32_to_f16(s * mid) == (sign | even),
                   "obd_f32_to_f16(s * mid), k = 0x%x", k);
            EXPECT(obd_f32_to_f16(s * below) == (sign | k),
                   "obd_f32_to_f16(s * below), k = 0x%x", k);
            EXPECT(obd_f32_to_f16(s * above) == (sign | (k + 1)),
                   "obd_f32_to_f16(s * above), k = 0x%x", k);
        }
    }
    for (uint32_t k = 0; k < 0x7f80; k++) {
        float mid = ffrom((k << 16) | 0x8000);
        uint16_t even = (uint16_t)((k & 1) ? k + 1 : k);
        EXPECT(obd_f32_to_bf16(mid) == (even), "obd_f32_to_bf16(mid), k = 0x%x",
               k);
        EXPECT(obd_f32_to_bf16(-mid) == (0x8000 | even),
               "obd_f32_to_bf16(-mid), k = 0x%x", k);
        EXPECT(obd_f32_to_bf16(ffrom((k << 16) | 0x7fff)) == (k),
               "obd_f32_to_bf16(ffrom((k << 16) | 0x7fff)), k = 0x%x", k);
        EXPECT(obd_f32_to_bf16(ffrom((k << 16) | 0x8001)) == (k + 1),
               "obd_f32_to_bf16(ffrom((k << 16) | 0x8001)), k = 0x%x", k);
    }
}
END_TEST

/* A sample of about 4.3 million fp32 bit patterns spread over the whole
 * range (every 997th) against ref_nearest. */
START_TEST(test_half_sample)
{
    for (uint64_t u = 0; u < 0x100000000ull; u += 997) {
        float f = ffrom((uint32_t)u);
        uint16_t h = obd_f32_to_f16(f), b = obd_f32_to_bf16(f);
        if (isnan(f)) {
            EXPECT(is_f16_nan(h) && is_bf16_nan(b), "NaN 0x%08x", (uint32_t)u);
            continue;
        }
        EXPECT(h == ref_nearest(f, f16_vals, 0x7c01), "fp16 of 0x%08x: 0x%04x",
               (uint32_t)u, h);
        EXPECT(b == ref_nearest(f, bf16_vals, 0x7f81), "bf16 of 0x%08x: 0x%04x",
               (uint32_t)u, b);
    }
}
END_TEST

/* ---- Reductions against naive code ------------------------------------- */

/* Naive float op: NaN if either operand is NaN; on equality the right
 * operand (reduce.h fixes this for +0 / -0). */
static double ref_fop(obcomm_op_t op, double a, double b)
{
    if (op == OBCOMM_SUM || op == OBCOMM_AVG) {
        return a + b;
    }
    if (isnan(a) || isnan(b)) {
        return NAN;
    }
    if (op == OBCOMM_MAX) {
        return a > b ? a : b;
    }
    return a < b ? a : b;
}

/* Float ops in fp32 must round in fp32, so they are not done in double. */
static float ref_fop32(obcomm_op_t op, float a, float b)
{
    if (op == OBCOMM_SUM || op == OBCOMM_AVG) {
        return a + b;
    }
    return (float)ref_fop(op, a, b);
}

static int64_t ref_iop(obcomm_op_t op, int64_t a, int64_t b, int bits)
{
    if (op == OBCOMM_SUM || op == OBCOMM_AVG) {
        uint64_t s = (uint64_t)a + (uint64_t)b;
        if (bits == 32) {
            return (int32_t)(uint32_t)s;
        }
        return (int64_t)s;
    }
    if (op == OBCOMM_MAX) {
        return a > b ? a : b;
    }
    return a < b ? a : b;
}

/* Per-element reference of load + store: acc[i] and dst[i]. */
static void ref_reduce(obcomm_dtype_t dt, obcomm_op_t op, void *const *src,
                       int nsrc, size_t count, int divisor, void *acc,
                       void *dst)
{
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case OBCOMM_FLOAT32: {
            float a = ((float *)src[0])[i];
            for (int k = 1; k < nsrc; k++) {
                a = ref_fop32(op, a, ((float *)src[k])[i]);
            }
            ((float *)acc)[i] = a;
            ((float *)dst)[i] = op == OBCOMM_AVG ? a / (float)divisor : a;
            break;
        }
        case OBCOMM_FLOAT64: {
            double a = ((double *)src[0])[i];
            for (int k = 1; k < nsrc; k++) {
                a = ref_fop(op, a, ((double *)src[k])[i]);
            }
            ((double *)acc)[i] = a;
            ((double *)dst)[i] = op == OBCOMM_AVG ? a / divisor : a;
            break;
        }
        case OBCOMM_FLOAT16:
        case OBCOMM_BFLOAT16: {
            int f16 = dt == OBCOMM_FLOAT16;
            float (*widen)(uint16_t) = f16 ? obd_f16_to_f32 : obd_bf16_to_f32;
            uint16_t (*narrow)(float) = f16 ? obd_f32_to_f16 : obd_f32_to_bf16;
            float a = widen(((uint16_t *)src[0])[i]);
            for (int k = 1; k < nsrc; k++) {
                a = ref_fop32(op, a, widen(((uint16_t *)src[k])[i]));
            }
            ((float *)acc)[i] = a;
            ((uint16_t *)dst)[i] =
                narrow(op == OBCOMM_AVG ? a / (float)divisor : a);
            break;
        }
        case OBCOMM_INT32: {
            int64_t a = ((int32_t *)src[0])[i];
            for (int k = 1; k < nsrc; k++) {
                a = ref_iop(op, a, ((int32_t *)src[k])[i], 32);
            }
            ((int32_t *)acc)[i] = (int32_t)a;
            ((int32_t *)dst)[i] = (int32_t)(op == OBCOMM_AVG ? a / divisor : a);
            break;
        }
        case OBCOMM_INT64: {
            int64_t a = ((int64_t *)src[0])[i];
            for (int k = 1; k < nsrc; k++) {
                a = ref_iop(op, a, ((int64_t *)src[k])[i], 64);
            }
            ((int64_t *)acc)[i] = a;
            ((int64_t *)dst)[i] = op == OBCOMM_AVG ? a / divisor : a;
            break;
        }
        }
    }
}

/* Random finite data; floats of moderate size so sums stay finite, integers
 * over the full range so that SUM wraps often. */
static void fill(obcomm_dtype_t dt, void *buf, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case OBCOMM_FLOAT32:
            ((float *)buf)[i] = (float)rng_real();
            break;
        case OBCOMM_FLOAT64:
            ((double *)buf)[i] = rng_real();
            break;
        case OBCOMM_FLOAT16: {
            /* Any finite pattern, subnormals included. */
            uint16_t h;
            do {
                h = (uint16_t)rng();
            } while ((h & 0x7c00) == 0x7c00);
            ((uint16_t *)buf)[i] = h;
            break;
        }
        case OBCOMM_BFLOAT16: {
            /* Exponents 2^-40 .. 2^40 around 1, any mantissa and sign. */
            uint64_t r = rng();
            uint32_t exp = 87 + (uint32_t)(r % 81);
            uint32_t low = (uint32_t)(r >> 8) & 0x807f;
            ((uint16_t *)buf)[i] = (uint16_t)(low | (exp << 7));
            break;
        }
        case OBCOMM_INT32:
            ((int32_t *)buf)[i] = (int32_t)(uint32_t)rng();
            break;
        case OBCOMM_INT64:
            ((int64_t *)buf)[i] = (int64_t)rng();
            break;
        }
    }
    /* Some equal elements across calls exercise MAX/MIN ties. */
    if (count > 2) {
        memset(buf, 0, obd_dtype_size(dt));
    }
}

static const size_t counts[] = {1, 3, 17, 1000003};
static const obcomm_op_t ops[] = {OBCOMM_SUM, OBCOMM_AVG, OBCOMM_MAX,
                                  OBCOMM_MIN};

/* For one dtype (the loop index), every op, count and nsrc in {1, 2, 3}:
 *   - load then store equals the reference, in acc and in dst;
 *   - load of the first nsrc-1 sources, load of the last, then acc, gives
 *     the same accumulator (partials arriving from the network);
 *   - store_many writes the reference result to three destinations. */
START_TEST(test_reduce_vs_naive)
{
    obcomm_dtype_t dt = (obcomm_dtype_t)_i;
    size_t es = obd_dtype_size(dt), as = obd_dtype_acc_size(dt);
    size_t maxc = counts[sizeof(counts) / sizeof(counts[0]) - 1];
    void *src[3], *dst[3];
    for (int k = 0; k < 3; k++) {
        src[k] = malloc(maxc * es);
        dst[k] = malloc(maxc * es);
        ck_assert_ptr_nonnull(src[k]);
        ck_assert_ptr_nonnull(dst[k]);
    }
    void *acc = malloc(maxc * as), *acc2 = malloc(maxc * as);
    void *ref_acc = malloc(maxc * as), *ref_dst = malloc(maxc * es);
    ck_assert(acc && acc2 && ref_acc && ref_dst);

    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c];
        for (int k = 0; k < 3; k++) {
            fill(dt, src[k], n);
        }
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            obcomm_op_t op = ops[o];
            for (int nsrc = 1; nsrc <= 3; nsrc++) {
                int divisor = nsrc + 1;
                const char *what = obd_op_name(op);
                ref_reduce(dt, op, src, nsrc, n, divisor, ref_acc, ref_dst);

                memset(acc, 0xa5, n * as);
                obd_reduce_load(dt, op, acc, (const void *const *)src, nsrc, n);
                ck_assert_msg(memcmp(acc, ref_acc, n * as) == 0,
                              "load %s count %zu nsrc %d", what, n, nsrc);

                memset(dst[0], 0xa5, n * es);
                obd_reduce_store(dt, op, dst[0], acc, n, divisor);
                ck_assert_msg(memcmp(dst[0], ref_dst, n * es) == 0,
                              "store %s count %zu nsrc %d", what, n, nsrc);

                if (nsrc >= 2) {
                    obd_reduce_load(dt, op, acc, (const void *const *)src,
                                    nsrc - 1, n);
                    obd_reduce_load(dt, op, acc2,
                                    (const void *const *)&src[nsrc - 1], 1, n);
                    obd_reduce_acc(dt, op, acc, acc2, n);
                    ck_assert_msg(memcmp(acc, ref_acc, n * as) == 0,
                                  "acc %s count %zu nsrc %d", what, n, nsrc);
                }

                for (int k = 0; k < 3; k++) {
                    memset(dst[k], 0x5a, n * es);
                }
                obd_reduce_store_many(dt, op, dst, 3, acc, n, divisor);
                for (int k = 0; k < 3; k++) {
                    ck_assert_msg(memcmp(dst[k], ref_dst, n * es) == 0,
                                  "store_many[%d] %s count %zu nsrc %d", k,
                                  what, n, nsrc);
                }
            }
        }
    }

    for (int k = 0; k < 3; k++) {
        free(src[k]);
        free(dst[k]);
    }
    free(acc);
    free(acc2);
    free(ref_acc);
    free(ref_dst);
}
END_TEST

/* ---- Specific behaviour ------------------------------------------------ */

START_TEST(test_int_sum_wraps)
{
    int32_t a[] = {INT32_MAX, INT32_MIN, INT32_MAX, -1};
    int32_t b[] = {1, -1, INT32_MAX, INT32_MIN};
    int32_t c[] = {0, 0, INT32_MAX, 0};
    int32_t want[] = {INT32_MIN, INT32_MAX, 0x7ffffffd, INT32_MAX};
    const void *src[] = {a, b, c};
    int32_t acc[4], out[4];
    obd_reduce_load(OBCOMM_INT32, OBCOMM_SUM, acc, src, 3, 4);
    obd_reduce_store(OBCOMM_INT32, OBCOMM_SUM, out, acc, 4, 0);
    ck_assert_mem_eq(out, want, sizeof(want));

    /* The same through acc, as partial sums from peers. */
    int32_t part[4];
    memcpy(part, a, sizeof(a));
    obd_reduce_acc(OBCOMM_INT32, OBCOMM_SUM, part, b, 4);
    obd_reduce_acc(OBCOMM_INT32, OBCOMM_SUM, part, c, 4);
    ck_assert_mem_eq(part, want, sizeof(want));

    int64_t x[] = {INT64_MAX, INT64_MIN};
    int64_t y[] = {1, -1};
    int64_t want64[] = {INT64_MIN, INT64_MAX};
    const void *src64[] = {x, y};
    int64_t acc64[2];
    obd_reduce_load(OBCOMM_INT64, OBCOMM_SUM, acc64, src64, 2, 2);
    ck_assert_mem_eq(acc64, want64, sizeof(want64));
}
END_TEST

/* AVG on integers divides the sum, truncating toward zero. */
START_TEST(test_int_avg_truncates)
{
    int32_t acc[] = {-7, 7, -1, 1, -8, 5, 0, INT32_MIN};
    int32_t want[] = {-3, 3, 0, 0, -4, 2, 0, INT32_MIN / 2};
    int32_t out[8];
    obd_reduce_store(OBCOMM_INT32, OBCOMM_AVG, out, acc, 8, 2);
    ck_assert_mem_eq(out, want, sizeof(want));

    int64_t acc64[] = {-7, 7, -1, 1, -8, 5, 0, INT64_MIN};
    int64_t want64[] = {-3, 3, 0, 0, -4, 2, 0, INT64_MIN / 2};
    int64_t out64[8];
    obd_reduce_store(OBCOMM_INT64, OBCOMM_AVG, out64, acc64, 8, 2);
    ck_assert_mem_eq(out64, want64, sizeof(want64));

    /* -7 and 0 from two trainers, divided by 2 -> -3; -7/3 -> -2. */
    int32_t s0[] = {-7, -7}, s1[] = {0, 0}, sum[2], avg[2];
    const void *src[] = {s0, s1};
    obd_reduce_load(OBCOMM_INT32, OBCOMM_AVG, sum, src, 2, 2);
    obd_reduce_store(OBCOMM_INT32, OBCOMM_AVG, avg, sum, 1, 2);
    obd_reduce_store(OBCOMM_INT32, OBCOMM_AVG, avg + 1, sum + 1, 1, 3);
    ck_assert_int_eq(avg[0], -3);
    ck_assert_int_eq(avg[1], -2);

    /* SUM ignores the divisor. */
    obd_reduce_store(OBCOMM_INT32, OBCOMM_SUM, avg, sum, 2, 0);
    ck_assert_int_eq(avg[0], -7);
}
END_TEST

/* Float AVG divides in the accumulator type and rounds once to the dtype:
 * for fp16, 2049 / 2 = 1024.5 is a tie between 1024 and 1025 -> 1024, and
 * 4098 / 2 = 2049 (exact in fp32) is a tie between 2048 and 2050 -> 2048. */
START_TEST(test_float_avg)
{
    float acc[] = {2049.0f, 4098.0f, 1.0f, -3.0f};
    uint16_t out[4];
    obd_reduce_store(OBCOMM_FLOAT16, OBCOMM_AVG, out, acc, 4, 2);
    ck_assert_uint_eq(out[0], 0x6400); /* 1024 */
    ck_assert_uint_eq(out[1], 0x6800); /* 2048 */
    ck_assert_uint_eq(out[2], 0x3800); /* 0.5 */
    ck_assert_uint_eq(out[3], 0xbe00); /* -1.5 */

    double dacc[] = {1.0, 10.0};
    double dout[2];
    obd_reduce_store(OBCOMM_FLOAT64, OBCOMM_AVG, dout, dacc, 2, 3);
    ck_assert(dout[0] == 1.0 / 3.0 && dout[1] == 10.0 / 3.0);
}
END_TEST

/* The in-place division (a zero-copy ring's AVG) divides every element,
 * in the vectorised body and in the tail after the last multiple of 16,
 * exactly as one C division each: integers truncate toward zero, floats
 * round once (NaN, infinities, -0.0 and subnormals included). */
START_TEST(test_div_in_place)
{
    static const size_t lens[] = {0, 1, 15, 16, 17, 33, 1000};
    static const int divisors[] = {1, 2, 3, 4, 7};
    enum { N = 1000 };
    float f[N], fw[N];
    double d[N], dw[N];
    int32_t i32[N], i32w[N];
    int64_t i64[N], i64w[N];
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
        for (size_t v = 0; v < sizeof(divisors) / sizeof(divisors[0]); v++) {
            size_t n = lens[l];
            int q = divisors[v];
            for (size_t i = 0; i < N; i++) {
                uint64_t r = rng();
                f[i] = i % 5 == 0 ? ffrom((uint32_t)r) /* any bits */
                                  : (float)(rng_real() * 2e3 - 1e3);
                d[i] = rng_real() * 2e3 - 1e3;
                i32[i] = (int32_t)(uint32_t)r;
                i64[i] = (int64_t)r;
                fw[i] = i < n ? f[i] / (float)q : f[i];
                dw[i] = i < n ? d[i] / (double)q : d[i];
                i32w[i] = i < n ? i32[i] / q : i32[i];
                i64w[i] = i < n ? i64[i] / q : i64[i];
            }
            obd_reduce_div_in_place(OBCOMM_FLOAT32, f, n, q);
            obd_reduce_div_in_place(OBCOMM_FLOAT64, d, n, q);
            obd_reduce_div_in_place(OBCOMM_INT32, i32, n, q);
            obd_reduce_div_in_place(OBCOMM_INT64, i64, n, q);
            for (size_t i = 0; i < N; i++) {
                /* Bits: a NaN must come out as the same NaN. */
                EXPECT(fbits(f[i]) == fbits(fw[i]),
                       "float32 element %zu of %zu, divisor %d", i, n, q);
            }
            ck_assert_mem_eq(d, dw, sizeof(d));
            ck_assert_mem_eq(i32, i32w, sizeof(i32));
            ck_assert_mem_eq(i64, i64w, sizeof(i64));
        }
    }
}
END_TEST

/* Float sums are combined in src order: ((s0 + s1) + s2). */
START_TEST(test_float_order)
{
    float a = 1e8f, b = -1e8f, c = 1.0f, acc;
    const void *abc[] = {&a, &b, &c}, *acb[] = {&a, &c, &b};
    obd_reduce_load(OBCOMM_FLOAT32, OBCOMM_SUM, &acc, abc, 3, 1);
    ck_assert(acc == 1.0f);
    obd_reduce_load(OBCOMM_FLOAT32, OBCOMM_SUM, &acc, acb, 3, 1);
    ck_assert(acc == 0.0f);
}
END_TEST

/* MAX and MIN return NaN if any operand is NaN, wherever it stands. */
START_TEST(test_nan_propagates)
{
    const obcomm_op_t mm[] = {OBCOMM_MAX, OBCOMM_MIN};
    for (int o = 0; o < 2; o++) {
        obcomm_op_t op = mm[o];
        /* Element i has its NaN in source i (i < 3); element 3 has none. */
        float s[3][4] = {
            {NAN, 1, 2, 5}, {-INFINITY, NAN, INFINITY, -5}, {0, 3, NAN, 0}};
        const void *src[] = {s[0], s[1], s[2]};
        float acc[4];
        obd_reduce_load(OBCOMM_FLOAT32, op, acc, src, 3, 4);
        for (int i = 0; i < 3; i++) {
            ck_assert_msg(isnan(acc[i]), "%s element %d", obd_op_name(op), i);
        }
        ck_assert(acc[3] == (op == OBCOMM_MAX ? 5.0f : -5.0f));

        /* acc: NaN on either side. */
        float x[] = {NAN, 1, 7}, y[] = {1, NAN, 8};
        obd_reduce_acc(OBCOMM_FLOAT32, op, x, y, 3);
        ck_assert(isnan(x[0]) && isnan(x[1]));
        ck_assert(x[2] == (op == OBCOMM_MAX ? 8.0f : 7.0f));

        double dx[] = {NAN, 1, -INFINITY}, dy[] = {-INFINITY, NAN, NAN};
        const void *dsrc[] = {dx, dy};
        double dacc[3];
        obd_reduce_load(OBCOMM_FLOAT64, op, dacc, dsrc, 2, 3);
        ck_assert(isnan(dacc[0]) && isnan(dacc[1]) && isnan(dacc[2]));

        uint16_t hx[] = {0x7e00, 0x3c00}, hy[] = {0x3c00, 0xfc01};
        const void *hsrc[] = {hx, hy};
        float hacc[2];
        uint16_t hout[2];
        obd_reduce_load(OBCOMM_FLOAT16, op, hacc, hsrc, 2, 2);
        obd_reduce_store(OBCOMM_FLOAT16, op, hout, hacc, 2, 1);
        ck_assert(is_f16_nan(hout[0]) && is_f16_nan(hout[1]));

        uint16_t bx[] = {0x7fc0, 0x3f80}, by[] = {0x3f80, 0xff81};
        const void *bsrc[] = {bx, by};
        obd_reduce_load(OBCOMM_BFLOAT16, op, hacc, bsrc, 2, 2);
        obd_reduce_store(OBCOMM_BFLOAT16, op, hout, hacc, 2, 1);
        ck_assert(is_bf16_nan(hout[0]) && is_bf16_nan(hout[1]));
    }
}
END_TEST

/* nsrc == 1 with acc == src[0] is allowed when the types agree. */
START_TEST(test_load_in_place)
{
    float f[] = {1.5f, -2.0f, 3.0f};
    const void *fs[] = {f};
    obd_reduce_load(OBCOMM_FLOAT32, OBCOMM_MAX, f, fs, 1, 3);
    ck_assert(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.0f);

    int64_t i[] = {INT64_MIN, 0, INT64_MAX};
    const void *is[] = {i};
    obd_reduce_load(OBCOMM_INT64, OBCOMM_SUM, i, is, 1, 3);
    ck_assert(i[0] == INT64_MIN && i[1] == 0 && i[2] == INT64_MAX);

    /* count 0 touches nothing, even through NULL. */
    const void *none[] = {NULL};
    obd_reduce_load(OBCOMM_FLOAT16, OBCOMM_SUM, NULL, none, 1, 0);
    obd_reduce_acc(OBCOMM_INT32, OBCOMM_SUM, NULL, NULL, 0);
    obd_reduce_store(OBCOMM_FLOAT64, OBCOMM_AVG, NULL, NULL, 0, 2);
}
END_TEST

/* store_many: identical bytes in every destination, across blocks, and
 * nothing written past count. */
START_TEST(test_store_many)
{
    enum { N = 5000, NDST = 4 };
    static float acc[N];
    static uint16_t dst[NDST][N + 1], one[N + 1];
    for (int i = 0; i < N; i++) {
        acc[i] = (float)rng_real();
    }
    void *d[NDST];
    for (int k = 0; k < NDST; k++) {
        d[k] = dst[k];
        dst[k][N] = 0xbeef;
    }
    one[N] = 0xbeef;
    obd_reduce_store_many(OBCOMM_BFLOAT16, OBCOMM_AVG, d, NDST, acc, N, 3);
    obd_reduce_store(OBCOMM_BFLOAT16, OBCOMM_AVG, one, acc, N, 3);
    for (int i = 0; i < N; i++) {
        ck_assert_uint_eq(one[i], obd_f32_to_bf16(acc[i] / 3.0f));
    }
    for (int k = 0; k < NDST; k++) {
        ck_assert_mem_eq(dst[k], one, sizeof(one));
    }
}
END_TEST

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");

    TCase *tc = tcase_create("conversions");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, init_tables, NULL);
    tcase_add_test(tc, test_dtype_info);
    tcase_add_test(tc, test_f16_exhaustive);
    tcase_add_test(tc, test_bf16_exhaustive);
    tcase_add_test(tc, test_f16_rounding_cases);
    tcase_add_test(tc, test_bf16_rounding_cases);
    tcase_add_test(tc, test_half_midpoints);
    tcase_add_test(tc, test_half_sample);
    suite_add_tcase(s, tc);

    tc = tcase_create("reductions");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_reduce_vs_naive, OBCOMM_FLOAT32,
                        OBCOMM_INT64 + 1);
    tcase_add_test(tc, test_int_sum_wraps);
    tcase_add_test(tc, test_int_avg_truncates);
    tcase_add_test(tc, test_float_avg);
    tcase_add_test(tc, test_div_in_place);
    tcase_add_test(tc, test_float_order);
    tcase_add_test(tc, test_nan_propagates);
    tcase_add_test(tc, test_load_in_place);
    tcase_add_test(tc, test_store_many);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(reduce_suite());
}
