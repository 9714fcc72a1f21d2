/* The 1-bit codec: the portable implementation, the run-time dispatch and
 * the whole-tensor helpers. See codec.h for the contract and
 * docs/design.md, "The compressed allreduce, exactly", for the algorithm.
 *
 * The portable functions are written in the same lane structure as the
 * AVX2 ones (16 double accumulators for a norm, 8 elements per packed
 * byte), not because C needs it but because the sum of squares must be
 * formed in exactly the same order for both to produce identical bits.
 * Every other operation is element-wise IEEE fp32 arithmetic, which is
 * identical in any order once -ffp-contract=off forbids fused
 * multiply-adds. */
#include "codec.h"
#include "codec_impl.h"

#include <math.h>
#include <float.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

size_t obd_codec_padded_len(size_t count, int n)
{
    size_t a, b, g, lcm, unit;

    if (n < 1 || count == 0)
        return 0;
    /* lcm(n, 8) = n * 8 / gcd(n, 8); n / gcd is exact. */
    a = (size_t)n;
    b = 8;
    while (b != 0) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    g = a;
    lcm = (size_t)n / g * 8;
    if (lcm > SIZE_MAX / (size_t)n)
        return 0;
    unit = (size_t)n * lcm;
    if (count > SIZE_MAX - (unit - 1))
        return 0;
    return (count + unit - 1) / unit * unit;
}

/* A scale is acceptable from a peer if it is a finite number >= 0; -0.0
 * compares equal to 0 and is accepted, since +-(-0.0) only flips the sign
 * of a zero term. */
static int scale_ok(float s)
{
    return s >= 0.0f && s <= FLT_MAX;
}

int obd_codec_scale(const double *block_sums, size_t nblocks, size_t elems,
                    float *scale)
{
    double sum = 0.0;

    if (elems == 0)
        return OBD_E_INVAL;
    /* Left to right from 0.0, the order every caller relies on. */
    for (size_t j = 0; j < nblocks; j++)
        sum += block_sums[j];
    if (!isfinite(sum))
        return OBD_E_NONFINITE;
    /* A sum of finite fp32 squares is finite and its root mean square is
     * at most the largest |b_i|, so the conversion to float cannot
     * overflow. */
    *scale = (float)sqrt(sum / (double)elems);
    return 0;
}

/* Portable implementation.
 *
 * Signs here are random by nature, so a branch on a sign bit mispredicts
 * half the time and costs more than the arithmetic. The code selects
 * +scale or -scale by flipping the sign bit instead, which is exactly what
 * negation does in IEEE 754, and uses b - (+-scale), which IEEE defines as
 * b + (-+scale): the results are the ones codec.h specifies. */

static uint32_t float_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

/* +scale if bit is 1, -scale if bit is 0; scale given as its bits. */
static float plus_minus(uint32_t scale_bits, unsigned bit)
{
    uint32_t u = scale_bits ^ ((uint32_t)(bit ^ 1u) << 31);
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The average of the local buffers, eight elements from i, all inside
 * every source (i + 8 <= count): the fp32 sum in source order starting
 * from the first term, then the division by nsrc. For a power-of-two
 * nsrc, multiplying by the exact 1/nsrc rounds the same real number as
 * dividing by nsrc (also when it is subnormal), so the result is
 * identical and costs no division. */
static void avg8(const float *const *src, int nsrc, size_t i, float a[8])
{
    for (int j = 0; j < 8; j++)
        a[j] = src[0][i + j];
    for (int k = 1; k < nsrc; k++)
        for (int j = 0; j < 8; j++)
            a[j] += src[k][i + j];
    if (nsrc == 1)
        return;
    if ((nsrc & (nsrc - 1)) == 0) {
        float inv = 1.0f / (float)nsrc;
        for (int j = 0; j < 8; j++)
            a[j] *= inv;
    } else {
        for (int j = 0; j < 8; j++)
            a[j] /= (float)nsrc;
    }
}

/* One element of the average, zero past count; the same operations as
 * avg8 (0.0f divided by nsrc is 0.0f). */
static float avg1(const float *const *src, int nsrc, size_t count, size_t i)
{
    float a;

    if (i >= count)
        return 0.0f;
    a = src[0][i];
    for (int k = 1; k < nsrc; k++)
        a += src[k][i];
    if ((nsrc & (nsrc - 1)) == 0)
        return a * (1.0f / (float)nsrc);
    return a / (float)nsrc;
}

static void p_decompress(const uint8_t *bits, float scale, float *out,
                         size_t elems)
{
    uint32_t sb = float_bits(scale);
    size_t i = 0;

    for (; i + 8 <= elems; i += 8) {
        unsigned byte = bits[i / 8];
        for (int j = 0; j < 8; j++)
            out[i + j] = plus_minus(sb, (byte >> (7 - j)) & 1);
    }
    for (; i < elems; i++)
        out[i] = plus_minus(sb, (bits[i / 8] >> (7 - i % 8)) & 1);
}

/* ---- Lazy kernels (portable) ----
 *
 * The mode of the previous state is tested once per call, not per
 * element: each kernel is an always-inline body instantiated once per
 * mode, so the compiler sees a constant and drops the other branches. */

/* e_i of state (mode, scale bits sb, v) as codec.h defines it. */
static ALWAYS_INLINE float lazy_e(enum obd_codec_lazy_mode mode, const float *v,
                                  uint32_t sb, size_t i)
{
    float p;

    switch (mode) {
    case OBD_CODEC_LAZY_ZERO:
        return 0.0f;
    case OBD_CODEC_LAZY_EAGER:
        return v[i];
    default:
        p = v[i];
        return p - plus_minus(sb, p >= 0.0f);
    }
}

/* One element of the average, zero past count, with nsrc == 1 the source
 * itself (compress_avg's a_i; x_i for the single-source worker). */
static float lazy_a1(const float *const *src, int nsrc, size_t count, size_t i)
{
    if (i >= count)
        return 0.0f;
    if (nsrc == 1)
        return src[0][i];
    return avg1(src, nsrc, count, i);
}

/* The second half of a lazy step for eight elements from i, whose a
 * (average or participants' sum) is given: b = a + e, stored to next
 * (e is read first: next may be v), the packed byte of their signs, and
 * the squares added to acc8, the accumulators of lanes (i - begin) % 16
 * onwards. */
static ALWAYS_INLINE void lazy_finish8(enum obd_codec_lazy_mode mode,
                                       const float *v, uint32_t sb,
                                       const float a[8], float *next, size_t i,
                                       uint8_t *byte_out, double acc8[8])
{
    unsigned byte = 0;

    for (int j = 0; j < 8; j++) {
        float b = a[j] + lazy_e(mode, v, sb, i + (size_t)j);
        double d = b;
        next[i + (size_t)j] = b;
        byte |= (unsigned)(b >= 0.0f) << (7 - j);
        acc8[j] += d * d;
    }
    *byte_out = (uint8_t)byte;
}

/* a of the worker for eight elements from i. */
static ALWAYS_INLINE void lazy_a8(const float *const *src, int nsrc,
                                  size_t count, size_t i, float a[8])
{
    if (i + 8 <= count) {
        avg8(src, nsrc, i, a);
        return;
    }
    for (int j = 0; j < 8; j++)
        a[j] = lazy_a1(src, nsrc, count, i + (size_t)j);
}

/* Sixteen elements per iteration, so that each half always meets the same
 * eight accumulators; a last group of eight uses the first half. */
static ALWAYS_INLINE double
p_lazy_worker_mode(enum obd_codec_lazy_mode mode, const float *const *src,
                   int nsrc, size_t count, const struct obd_codec_lazy *prev,
                   float *next, size_t begin, size_t end, uint8_t *bits)
{
    double acc[16] = {0};
    uint32_t sb = float_bits(prev->scale);
    const float *v = prev->v;
    size_t i = begin;
    float a[8];

    for (; i + 16 <= end; i += 16) {
        lazy_a8(src, nsrc, count, i, a);
        lazy_finish8(mode, v, sb, a, next, i, &bits[(i - begin) / 8], acc);
        lazy_a8(src, nsrc, count, i + 8, a);
        lazy_finish8(mode, v, sb, a, next, i + 8, &bits[(i - begin) / 8 + 1],
                     acc + 8);
    }
    if (i < end) {
        lazy_a8(src, nsrc, count, i, a);
        lazy_finish8(mode, v, sb, a, next, i, &bits[(i - begin) / 8], acc);
    }
    return combine16(acc);
}

static double p_lazy_worker_block(const float *const *src, int nsrc,
                                  size_t count,
                                  const struct obd_codec_lazy *prev,
                                  float *next, size_t begin, size_t end,
                                  uint8_t *bits)
{
    switch (prev->mode) {
    case OBD_CODEC_LAZY_ZERO:
        return p_lazy_worker_mode(OBD_CODEC_LAZY_ZERO, src, nsrc, count, prev,
                                  next, begin, end, bits);
    case OBD_CODEC_LAZY_EAGER:
        return p_lazy_worker_mode(OBD_CODEC_LAZY_EAGER, src, nsrc, count, prev,
                                  next, begin, end, bits);
    default:
        return p_lazy_worker_mode(OBD_CODEC_LAZY_DEFERRED, src, nsrc, count,
                                  prev, next, begin, end, bits);
    }
}

/* The sum over participants of +-scale_k for eight elements from i, in
 * participant order starting from the first term, divided by n (a
 * multiply by the exact 1/n for a power-of-two n, as in avg8). */
static void server_a8(const uint8_t *const *in, const float *scales, int n,
                      size_t i, float m[8])
{
    size_t q = i / 8;
    uint32_t sb = float_bits(scales[0]);
    unsigned byte = in[0][q];

    for (int j = 0; j < 8; j++)
        m[j] = plus_minus(sb, (byte >> (7 - j)) & 1);
    for (int k = 1; k < n; k++) {
        sb = float_bits(scales[k]);
        byte = in[k][q];
        for (int j = 0; j < 8; j++)
            m[j] += plus_minus(sb, (byte >> (7 - j)) & 1);
    }
    if ((n & (n - 1)) == 0) {
        float inv = 1.0f / (float)n;
        for (int j = 0; j < 8; j++)
            m[j] = m[j] * inv;
    } else {
        for (int j = 0; j < 8; j++)
            m[j] = m[j] / (float)n;
    }
}

static ALWAYS_INLINE double
p_lazy_server_mode(enum obd_codec_lazy_mode mode, const uint8_t *const *in,
                   const float *scales, int n,
                   const struct obd_codec_lazy *prev, float *next, size_t begin,
                   size_t end, uint8_t *bits)
{
    double acc[16] = {0};
    uint32_t sb = float_bits(prev->scale);
    const float *v = prev->v;
    size_t i = begin;
    float a[8];

    for (; i + 16 <= end; i += 16) {
        server_a8(in, scales, n, i, a);
        lazy_finish8(mode, v, sb, a, next, i, &bits[(i - begin) / 8], acc);
        server_a8(in, scales, n, i + 8, a);
        lazy_finish8(mode, v, sb, a, next, i + 8, &bits[(i - begin) / 8 + 1],
                     acc + 8);
    }
    if (i < end) {
        server_a8(in, scales, n, i, a);
        lazy_finish8(mode, v, sb, a, next, i, &bits[(i - begin) / 8], acc);
    }
    return combine16(acc);
}

static double p_lazy_server_block(const uint8_t *const *in, const float *scales,
                                  int n, const struct obd_codec_lazy *prev,
                                  float *next, size_t begin, size_t end,
                                  uint8_t *bits)
{
    switch (prev->mode) {
    case OBD_CODEC_LAZY_ZERO:
        return p_lazy_server_mode(OBD_CODEC_LAZY_ZERO, in, scales, n, prev,
                                  next, begin, end, bits);
    case OBD_CODEC_LAZY_EAGER:
        return p_lazy_server_mode(OBD_CODEC_LAZY_EAGER, in, scales, n, prev,
                                  next, begin, end, bits);
    default:
        return p_lazy_server_mode(OBD_CODEC_LAZY_DEFERRED, in, scales, n, prev,
                                  next, begin, end, bits);
    }
}

static void p_lazy_error(const struct obd_codec_lazy *st, float *e,
                         size_t begin, size_t end)
{
    uint32_t sb = float_bits(st->scale);

    for (size_t i = begin; i < end; i++)
        e[i] = lazy_e(st->mode, st->v, sb, i);
}

static const struct obd_codec_impl portable = {
    .name = "portable",
    .lazy_worker_block = p_lazy_worker_block,
    .lazy_server_block = p_lazy_server_block,
    .lazy_error = p_lazy_error,
    .decompress = p_decompress,
    .decompress_stream = p_decompress, /* C has no streaming store */
};

const struct obd_codec_impl *obd_codec_portable(void)
{
    return &portable;
}

const struct obd_codec_impl *obd_codec_avx2(void)
{
#ifdef OBD_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        return obd_codec_avx2_table();
#endif
    return NULL;
}

/* The only mutable global of the codec: the chosen implementation, set once.
 * Threads that race on the first call compute the same answer; the
 * compare-and-swap keeps the first one so the pointer never changes after
 * it was handed out. */
static _Atomic(const struct obd_codec_impl *) best_impl;

const struct obd_codec_impl *obd_codec_best(void)
{
    const struct obd_codec_impl *p, *expected = NULL;
    const char *env;

    p = atomic_load_explicit(&best_impl, memory_order_acquire);
    if (p != NULL)
        return p;
    env = getenv("OBCOMM_CODEC");
    p = NULL;
    if (env == NULL || strcmp(env, "portable") != 0)
        p = obd_codec_avx2();
    if (p == NULL)
        p = &portable;
    if (!atomic_compare_exchange_strong_explicit(&best_impl, &expected, p,
                                                 memory_order_acq_rel,
                                                 memory_order_acquire))
        p = expected;
    return p;
}

/* A lazy state the kernels can read: a DEFERRED scale is one a committed
 * step produced (finite, >= 0), and every mode but ZERO needs v. */
static int lazy_ok(const struct obd_codec_lazy *st)
{
    switch (st->mode) {
    case OBD_CODEC_LAZY_ZERO:
        return 1;
    case OBD_CODEC_LAZY_EAGER:
        return st->v != NULL;
    case OBD_CODEC_LAZY_DEFERRED:
        return st->v != NULL && scale_ok(st->scale);
    }
    return 0;
}

int obd_codec_lazy_compress(const struct obd_codec_impl *impl,
                            const float *const *src, int nsrc, size_t count,
                            const struct obd_codec_lazy *prev, float *next,
                            size_t padded, uint8_t *bits, float *scale)
{
    double sum = 0.0;

    if (nsrc < 1 || padded == 0 || padded % 8 != 0 || count > padded ||
        !lazy_ok(prev))
        return OBD_E_INVAL;
    /* One pass; the block sums are added left to right from 0.0 as
     * obd_codec_scale adds them, so the scale is the one a caller gets
     * that runs the blocks on threads. */
    for (size_t j = 0; j < padded; j += OBD_CODEC_BLOCK) {
        size_t end =
            padded - j < OBD_CODEC_BLOCK ? padded : j + OBD_CODEC_BLOCK;
        sum += impl->lazy_worker_block(src, nsrc, count, prev, next, j, end,
                                       bits + j / 8);
    }
    return obd_codec_scale(&sum, 1, padded, scale);
}

int obd_codec_lazy_server(const struct obd_codec_impl *impl,
                          const uint8_t *const *in, const float *scales, int n,
                          const struct obd_codec_lazy *prev, float *next,
                          size_t chunk, uint8_t *bits, float *sscale)
{
    double sum = 0.0;

    if (n < 1 || chunk == 0 || chunk % 8 != 0 || !lazy_ok(prev))
        return OBD_E_INVAL;
    for (int k = 0; k < n; k++)
        if (!scale_ok(scales[k]))
            return OBD_E_NONFINITE;
    for (size_t j = 0; j < chunk; j += OBD_CODEC_BLOCK) {
        size_t end = chunk - j < OBD_CODEC_BLOCK ? chunk : j + OBD_CODEC_BLOCK;
        sum += impl->lazy_server_block(in, scales, n, prev, next, j, end,
                                       bits + j / 8);
    }
    return obd_codec_scale(&sum, 1, chunk, sscale);
}

void obd_codec_lazy_state_init(struct obd_codec_lazy_state *s, float *v)
{
    *s = (struct obd_codec_lazy_state){.v = v, .mode = OBD_CODEC_LAZY_ZERO};
}

void obd_codec_lazy_state_restore(struct obd_codec_lazy_state *s,
                                  const float *e, size_t n)
{
    if (e != s->v)
        memcpy(s->v, e, n * sizeof(float));
    s->mode = OBD_CODEC_LAZY_EAGER;
    s->scale = 0.0f;
}

struct obd_codec_lazy
obd_codec_lazy_state_prev(const struct obd_codec_lazy_state *s)
{
    return (struct obd_codec_lazy){s->mode, s->scale, s->v};
}

float *obd_codec_lazy_state_next(const struct obd_codec_lazy_state *s)
{
    return s->v;
}

void obd_codec_lazy_state_commit(struct obd_codec_lazy_state *s, float scale)
{
    s->mode = OBD_CODEC_LAZY_DEFERRED;
    s->scale = scale;
}

void obd_codec_lazy_state_abort(struct obd_codec_lazy_state *s)
{
    s->mode = OBD_CODEC_LAZY_ZERO;
    s->scale = 0.0f;
}
