/* Tests of the 1-bit codec (daemon/codec.c, daemon/codec_avx2.c).
 *
 * The reference below is written from docs/design.md, "The compressed
 * allreduce, exactly", and the exact arithmetic in codec.h, deliberately
 * naively: one plain double loop for a norm, one element at a time for
 * everything else. The implementations sum squares in a different
 * (lane-structured, blocked) order, so their scales may differ from the
 * reference by rounding; everything that does not depend on the scale (b,
 * m, the signs) must match exactly. Between the portable and the AVX2
 * implementation everything must match bit for bit.
 */
#include <check.h>

#include "ck_run.h"
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

static const int world_sizes[] = {1, 2, 3, 4, 5, 8, 16};
static const size_t counts[] = {1, 7, 8, 63, 1000003};
#define NSIZES  (sizeof(world_sizes) / sizeof(world_sizes[0]))
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

/* ck_assert reports every passing check to the parent process through a
 * pipe; over a million elements that costs minutes, so element loops use
 * this, which calls into Check only when the condition fails. */
#define EXPECT(cond, ...)              \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* Relative tolerance of a scale against the reference: both are a float
 * rounding of nearly the same double, so they differ by at most one float
 * ulp (2^-23 relative) in practice; 1e-6 leaves room for the different
 * summation order. */
#define SCALE_RTOL 1e-6

/* Deterministic inputs: xorshift64*, never rand(). */
struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [-1, 1). */
static float rng_unit(struct rng *r)
{
    return (float)((double)(rng_next(r) >> 11) * 0x1p-52 - 1.0);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

static float *fdup(const float *a, size_t n)
{
    float *p = xmalloc(n * sizeof(float));
    memcpy(p, a, n * sizeof(float));
    return p;
}

static void fill_unit(struct rng *r, float *a, size_t n, float mul)
{
    for (size_t i = 0; i < n; i++)
        a[i] = rng_unit(r) * mul;
}

static void fill_bytes(struct rng *r, uint8_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (uint8_t)(rng_next(r) >> 56);
}

/* The implementations under test: portable always, AVX2 when present. */
static int impls(const struct obd_codec_impl *out[2])
{
    int k = 0;

    out[k++] = obd_codec_portable();
    if (obd_codec_avx2() != NULL)
        out[k++] = obd_codec_avx2();
    return k;
}

/* ---- Naive reference: docs/design.md, "The compressed allreduce, exactly" */

static size_t ref_padded(size_t count, int n)
{
    size_t lcm = (size_t)n;

    while (lcm % 8 != 0)
        lcm += (size_t)n;
    size_t unit = (size_t)n * lcm;
    size_t N = 0;
    while (N < count)
        N += unit;
    return N;
}

static int ref_bit(const uint8_t *bits, size_t i)
{
    return (bits[i / 8] >> (7 - i % 8)) & 1;
}

static void ref_set_bit(uint8_t *bits, size_t i, int v)
{
    if (v)
        bits[i / 8] |= (uint8_t)(0x80 >> (i % 8));
    else
        bits[i / 8] &= (uint8_t) ~(0x80 >> (i % 8));
}

/* Steps 2-3 for one worker. Returns -1 (writing nothing) on non-finite b. */
static int ref_worker(const float *x, size_t count, float *e, size_t N,
                      uint8_t *bits, float *scale)
{
    float *b = xmalloc(N * sizeof(float));
    double sumsq = 0.0;

    for (size_t i = 0; i < N; i++) {
        float xi = i < count ? x[i] : 0.0f;
        b[i] = xi + e[i];
        if (!isfinite(b[i])) {
            free(b);
            return -1;
        }
        sumsq += (double)b[i] * (double)b[i];
    }
    float sc = (float)sqrt(sumsq / (double)N);
    for (size_t i = 0; i < N; i++) {
        float s = b[i] >= 0.0f ? 1.0f : -1.0f;
        e[i] = b[i] - sc * s;
        ref_set_bit(bits, i, s > 0.0f);
    }
    *scale = sc;
    free(b);
    return 0;
}

/* Step 4 for one server; m is also returned for the sign-ambiguity test. */
static int ref_server(const uint8_t *const *in, const float *scales, int n,
                      float *err, size_t chunk, uint8_t *bits, float *sscale,
                      float *m_out)
{
    float *m = xmalloc(chunk * sizeof(float));
    double sumsq = 0.0;

    for (int k = 0; k < n; k++)
        if (!(scales[k] >= 0.0f) || isinf(scales[k])) {
            free(m);
            return -1;
        }
    for (size_t i = 0; i < chunk; i++) {
        float a = 0.0f;
        for (int k = 0; k < n; k++)
            a += (ref_bit(in[k], i) ? 1.0f : -1.0f) * scales[k];
        m[i] = a / (float)n + err[i];
        if (!isfinite(m[i])) {
            free(m);
            return -1;
        }
        sumsq += (double)m[i] * (double)m[i];
    }
    float sc = (float)sqrt(sumsq / (double)chunk);
    for (size_t i = 0; i < chunk; i++) {
        float t = m[i] >= 0.0f ? 1.0f : -1.0f;
        err[i] = m[i] - sc * t;
        ref_set_bit(bits, i, t > 0.0f);
        if (m_out)
            m_out[i] = m[i];
    }
    *sscale = sc;
    free(m);
    return 0;
}

/* Steps 2-3 over the exact average of nsrc local buffers, as codec.h
 * spells it: a = src_0 + src_1 + ... in order, a / (float)nsrc, b = a + e.
 * b_out (N floats) receives b. Returns -1 (writing nothing) on non-finite
 * b. */
static int ref_avg_worker(const float *const *src, int nsrc, size_t count,
                          float *e, size_t N, uint8_t *bits, float *scale,
                          float *b_out)
{
    float *b = xmalloc(N * sizeof(float));
    double sumsq = 0.0;

    for (size_t i = 0; i < N; i++) {
        float a = i < count ? src[0][i] : 0.0f;
        for (int k = 1; k < nsrc; k++)
            a += i < count ? src[k][i] : 0.0f;
        a = a / (float)nsrc;
        b[i] = a + e[i];
        if (!isfinite(b[i])) {
            free(b);
            return -1;
        }
        sumsq += (double)b[i] * (double)b[i];
    }
    float sc = (float)sqrt(sumsq / (double)N);
    for (size_t i = 0; i < N; i++) {
        float s = b[i] >= 0.0f ? 1.0f : -1.0f;
        e[i] = b[i] - sc * s;
        ref_set_bit(bits, i, s > 0.0f);
    }
    *scale = sc;
    memcpy(b_out, b, N * sizeof(float));
    free(b);
    return 0;
}

static void ref_decompress(const uint8_t *bits, float scale, float *out,
                           size_t elems, int add)
{
    for (size_t i = 0; i < elems; i++) {
        float v = ref_bit(bits, i) ? scale : -scale;
        out[i] = add ? out[i] + v : v;
    }
}

/* ---- Comparison helpers ---------------------------------------------- */

static void assert_scale_close(float got, float want)
{
    double d = fabs((double)got - (double)want);
    ck_assert_msg(d <= SCALE_RTOL * fabs((double)want), "scale %a vs ref %a",
                  (double)got, (double)want);
}

/* An error element computed as b -+ scale against the reference's
 * b -+ scale_ref with the same b and sign: they differ by the scale
 * difference plus one rounding of each, i.e. at most
 * |scale - scale_ref| + FLT_EPSILON * max(|e|, |e_ref|) + FLT_TRUE_MIN. */
static void assert_err_close(const float *got, const float *want, size_t n,
                             float sc, float sc_ref)
{
    double ds = fabs((double)sc - (double)sc_ref);

    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        double tol = ds + FLT_EPSILON * fmax(fabs(g), fabs(w)) + FLT_TRUE_MIN;
        EXPECT(fabs(g - w) <= tol, "err[%zu] = %a, ref %a", i, g, w);
    }
}

/* ---- Padded length ---------------------------------------------------- */

START_TEST(padded_len_exact)
{
    /* Hand-computed: the unit n * lcm(n, 8) is 8, 16, 72, 32, 200, 64, 256
     * for n = 1, 2, 3, 4, 5, 8, 16. */
    static const size_t want[NCOUNTS][NSIZES] = {
        {8, 16, 72, 32, 200, 64, 256},
        {8, 16, 72, 32, 200, 64, 256},
        {8, 16, 72, 32, 200, 64, 256},
        {64, 64, 72, 64, 200, 64, 256},
        {1000008, 1000016, 1000008, 1000032, 1000200, 1000064, 1000192},
    };

    for (size_t c = 0; c < NCOUNTS; c++)
        for (size_t s = 0; s < NSIZES; s++) {
            size_t got = obd_codec_padded_len(counts[c], world_sizes[s]);
            ck_assert_uint_eq(got, want[c][s]);
            ck_assert_uint_eq(got, ref_padded(counts[c], world_sizes[s]));
            ck_assert_uint_eq(got % (size_t)world_sizes[s], 0);
            ck_assert_uint_eq(got / (size_t)world_sizes[s] % 8, 0);
        }
    ck_assert_uint_eq(obd_codec_padded_len(0, 3), 0);
    ck_assert_uint_eq(obd_codec_padded_len(5, 0), 0);
    ck_assert_uint_eq(obd_codec_padded_len(5, -1), 0);
    ck_assert_uint_eq(obd_codec_padded_len(SIZE_MAX - 7, 1), SIZE_MAX - 7);
    ck_assert_uint_eq(obd_codec_padded_len(SIZE_MAX - 6, 1), 0);
    ck_assert_uint_eq(obd_codec_padded_len(SIZE_MAX, 3), 0);
    ck_assert_uint_eq(obd_codec_padded_len(1, INT_MAX), 0);
    ck_assert_uint_eq(obd_codec_padded_len(1, 1 << 20), (size_t)1 << 40);
}
END_TEST

/* ---- Worker compress against the reference ---------------------------- */

/* Compresses x (+ e) with every implementation and the reference; checks
 * bits exactly, the scale to SCALE_RTOL and the error to the bound of
 * assert_err_close. */
static void check_worker(const float *x, size_t count, const float *e0,
                         size_t N)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    size_t nb = N / 8;
    uint8_t *rbits = xmalloc(nb), *bits = xmalloc(nb);
    float *re = fdup(e0, N), rscale;

    memset(rbits, 0, nb);
    ck_assert_int_eq(ref_worker(x, count, re, N, rbits, &rscale), 0);
    for (int k = 0; k < ni; k++) {
        float *e = fdup(e0, N), scale = -1.0f;
        ck_assert_int_eq(
            obd_codec_compress(im[k], x, count, e, N, bits, &scale), 0);
        ck_assert_msg(memcmp(bits, rbits, nb) == 0, "%s: bits", im[k]->name);
        assert_scale_close(scale, rscale);
        assert_err_close(e, re, N, scale, rscale);
        free(e);
    }
    free(re);
    free(bits);
    free(rbits);
}

START_TEST(worker_vs_reference)
{
    struct rng r = {0x1234567u};

    for (size_t c = 0; c < NCOUNTS; c++)
        for (size_t s = 0; s < NSIZES; s++) {
            size_t count = counts[c];
            size_t N = obd_codec_padded_len(count, world_sizes[s]);
            float *x = xmalloc(count * sizeof(float));
            float *e = xmalloc(N * sizeof(float));

            fill_unit(&r, x, count, 3.0f);
            fill_unit(&r, e, N, 0.5f);
            check_worker(x, count, e, N);
            /* Fresh state: the error starts at zero. */
            memset(e, 0, N * sizeof(float));
            check_worker(x, count, e, N);
            free(e);
            free(x);
        }
}
END_TEST

/* Adversarial finite inputs, checked against the reference like above. */
START_TEST(worker_adversarial)
{
    struct rng r = {99};
    const size_t count = 1003, N = obd_codec_padded_len(count, 3);
    float *x = xmalloc(count * sizeof(float));
    float *e = xmalloc(N * sizeof(float));
    const struct obd_codec_impl *im[2];
    int ni = impls(im);

    /* All zeros: scale 0, every sign +1 (bit 1), error stays 0. */
    memset(x, 0, count * sizeof(float));
    memset(e, 0, N * sizeof(float));
    check_worker(x, count, e, N);
    for (int k = 0; k < ni; k++) {
        float *ek = fdup(e, N), sc = -1.0f;
        uint8_t *bits = xmalloc(N / 8);
        ck_assert_int_eq(obd_codec_compress(im[k], x, count, ek, N, bits, &sc),
                         0);
        ck_assert(sc == 0.0f);
        for (size_t i = 0; i < N / 8; i++)
            EXPECT(bits[i] == 0xff, "bits[%zu]", i);
        for (size_t i = 0; i < N; i++)
            EXPECT(ek[i] == 0.0f, "e[%zu]", i);
        free(bits);
        free(ek);
    }

    /* -0.0 in both x and e gives b = -0.0, which counts as +1. */
    for (size_t i = 0; i < count; i++)
        x[i] = -0.0f;
    for (size_t i = 0; i < N; i++)
        e[i] = -0.0f;
    check_worker(x, count, e, N);
    for (int k = 0; k < ni; k++) {
        float *ek = fdup(e, N), sc;
        uint8_t *bits = xmalloc(N / 8);
        ck_assert_int_eq(obd_codec_compress(im[k], x, count, ek, N, bits, &sc),
                         0);
        for (size_t i = 0; i < N / 8; i++)
            EXPECT(bits[i] == 0xff, "bits[%zu]", i);
        free(bits);
        free(ek);
    }

    /* Denormals of both signs, with a zero error and a denormal error. */
    for (size_t i = 0; i < count; i++)
        x[i] = rng_unit(&r) * 0x1p-130f;
    memset(e, 0, N * sizeof(float));
    check_worker(x, count, e, N);
    for (size_t i = 0; i < N; i++)
        e[i] = rng_unit(&r) * 0x1p-140f;
    check_worker(x, count, e, N);

    /* Huge but finite values: squares stay finite in double. */
    for (size_t i = 0; i < count; i++)
        x[i] = (rng_next(&r) & 1) ? 3e38f : -3e38f;
    memset(e, 0, N * sizeof(float));
    check_worker(x, count, e, N);
    x[5] = FLT_MAX;
    x[6] = -FLT_MAX;
    check_worker(x, count, e, N);

    /* A mix spanning the whole exponent range. */
    for (size_t i = 0; i < count; i++)
        x[i] = ldexpf(rng_unit(&r), (int)(rng_next(&r) % 250) - 140);
    fill_unit(&r, e, N, 1e-3f);
    check_worker(x, count, e, N);

    free(e);
    free(x);
}
END_TEST

/* Compress must fail with ENONFINITE and leave e, bits and scale exactly
 * as they were. */
static void expect_worker_rejects(const float *x, size_t count, const float *e0,
                                  size_t N)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    uint8_t *bits = xmalloc(N / 8), *bits0 = xmalloc(N / 8);
    float *re = fdup(e0, N), rs;

    memset(bits0, 0xa5, N / 8);
    ck_assert_int_eq(ref_worker(x, count, re, N, bits0, &rs), -1);
    for (int k = 0; k < ni; k++) {
        float *e = fdup(e0, N), sc = 1234.5f, sc0 = 1234.5f;
        memcpy(bits, bits0, N / 8);
        ck_assert_int_eq(obd_codec_compress(im[k], x, count, e, N, bits, &sc),
                         OBD_CODEC_ENONFINITE);
        ck_assert(memcmp(e, e0, N * sizeof(float)) == 0);
        ck_assert(memcmp(bits, bits0, N / 8) == 0);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
        free(e);
    }
    free(re);
    free(bits0);
    free(bits);
}

START_TEST(worker_nonfinite)
{
    struct rng r = {7};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};

    for (size_t c = 0; c < NCOUNTS; c++) {
        size_t count = counts[c], N = obd_codec_padded_len(count, 3);
        float *x = xmalloc(count * sizeof(float));
        float *e = xmalloc(N * sizeof(float));
        size_t xpos[] = {0, count / 2, count - 1};
        size_t epos[] = {0, count - 1, count, N - 1};

        fill_unit(&r, x, count, 1.0f);
        fill_unit(&r, e, N, 0.1f);
        for (size_t b = 0; b < 4; b++) {
            for (size_t p = 0; p < 3; p++) {
                float keep = x[xpos[p]];
                x[xpos[p]] = bad[b];
                expect_worker_rejects(x, count, e, N);
                x[xpos[p]] = keep;
            }
            /* In the error buffer, including the padding tail past count
             * where x reads as zero. */
            for (size_t p = 0; p < 4; p++) {
                float keep = e[epos[p]];
                e[epos[p]] = bad[b];
                expect_worker_rejects(x, count, e, N);
                e[epos[p]] = keep;
            }
        }
        /* Finite x and e whose sum overflows to +-Inf. */
        {
            size_t p = count - 1;
            float kx = x[p], ke = e[p];
            x[p] = 3e38f;
            e[p] = 3e38f;
            expect_worker_rejects(x, count, e, N);
            x[p] = -3e38f;
            e[p] = -3e38f;
            expect_worker_rejects(x, count, e, N);
            x[p] = kx;
            e[p] = ke;
        }
        free(e);
        free(x);
    }
}
END_TEST

START_TEST(invalid_sizes)
{
    const struct obd_codec_impl *p = obd_codec_portable();
    float x[16] = {0}, e[16] = {0}, sc = 7.0f, scales[1] = {1.0f};
    uint8_t bits[2] = {0x5a, 0x5a};
    const uint8_t *in[1] = {bits};
    double sum = 1.0;

    ck_assert_int_eq(obd_codec_compress(p, x, 1, e, 0, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_compress(p, x, 1, e, 12, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_compress(p, x, 17, e, 16, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_server(p, in, scales, 0, e, 8, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_server(p, in, scales, 1, e, 12, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_scale(&sum, 1, 0, &sc), OBD_CODEC_EINVAL);
    ck_assert(sc == 7.0f);
    ck_assert_uint_eq(bits[0], 0x5a);
}
END_TEST

START_TEST(scale_combine)
{
    double sums[3] = {1.0, 2.0, 6.0}, bad[2] = {1.0, INFINITY};
    float sc = -1.0f;

    ck_assert_int_eq(obd_codec_scale(sums, 3, 9, &sc), 0);
    ck_assert(sc == 1.0f);
    ck_assert_int_eq(obd_codec_scale(bad, 2, 9, &sc), OBD_CODEC_ENONFINITE);
    ck_assert(sc == 1.0f);
    bad[1] = NAN;
    ck_assert_int_eq(obd_codec_scale(bad, 2, 9, &sc), OBD_CODEC_ENONFINITE);
    ck_assert(sc == 1.0f);
}
END_TEST

/* ---- Server step against the reference -------------------------------- */

struct server_in {
    int n;
    size_t chunk;
    uint8_t *bits[16];
    const uint8_t *in[16];
    float scales[16];
    float *err;
};

static void server_in_init(struct server_in *s, struct rng *r, int n,
                           size_t chunk)
{
    s->n = n;
    s->chunk = chunk;
    for (int k = 0; k < n; k++) {
        s->bits[k] = xmalloc(chunk / 8);
        fill_bytes(r, s->bits[k], chunk / 8);
        s->in[k] = s->bits[k];
        s->scales[k] = (float)(0.25 + (rng_next(r) >> 11) * 0x1p-53);
    }
    s->err = xmalloc(chunk * sizeof(float));
    fill_unit(r, s->err, chunk, 0.3f);
}

static void server_in_fini(struct server_in *s)
{
    for (int k = 0; k < s->n; k++)
        free(s->bits[k]);
    free(s->err);
}

static void check_server(const struct server_in *s)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    size_t nb = s->chunk / 8;
    uint8_t *rbits = xmalloc(nb), *bits = xmalloc(nb);
    float *rerr = fdup(s->err, s->chunk), rsc;

    memset(rbits, 0, nb);
    ck_assert_int_eq(
        ref_server(s->in, s->scales, s->n, rerr, s->chunk, rbits, &rsc, NULL),
        0);
    for (int k = 0; k < ni; k++) {
        float *err = fdup(s->err, s->chunk), sc = -1.0f;
        ck_assert_int_eq(obd_codec_server(im[k], s->in, s->scales, s->n, err,
                                          s->chunk, bits, &sc),
                         0);
        ck_assert_msg(memcmp(bits, rbits, nb) == 0, "%s: server bits",
                      im[k]->name);
        assert_scale_close(sc, rsc);
        assert_err_close(err, rerr, s->chunk, sc, rsc);
        free(err);
    }
    free(rerr);
    free(bits);
    free(rbits);
}

START_TEST(server_vs_reference)
{
    struct rng r = {0xfeedu};

    for (size_t c = 0; c < NCOUNTS; c++)
        for (size_t z = 0; z < NSIZES; z++) {
            int n = world_sizes[z];
            size_t chunk = obd_codec_padded_len(counts[c], n) / (size_t)n;
            struct server_in s;

            server_in_init(&s, &r, n, chunk);
            check_server(&s);
            /* Zero server error, and equal scales so that terms cancel to
             * exact zeros, which must count as +1. */
            memset(s.err, 0, chunk * sizeof(float));
            for (int k = 0; k < n; k++)
                s.scales[k] = 0.5f;
            check_server(&s);
            /* -0.0 scales are accepted (they are not negative). */
            for (int k = 0; k < n; k++)
                s.scales[k] = -0.0f;
            check_server(&s);
            server_in_fini(&s);
        }
}
END_TEST

static void expect_server_rejects(const struct server_in *s)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    size_t nb = s->chunk / 8;
    uint8_t *bits = xmalloc(nb), *bits0 = xmalloc(nb);

    memset(bits0, 0x3c, nb);
    for (int k = 0; k < ni; k++) {
        float *err = fdup(s->err, s->chunk), sc = 42.0f, sc0 = 42.0f;
        memcpy(bits, bits0, nb);
        ck_assert_int_eq(obd_codec_server(im[k], s->in, s->scales, s->n, err,
                                          s->chunk, bits, &sc),
                         OBD_CODEC_ENONFINITE);
        ck_assert(memcmp(err, s->err, s->chunk * sizeof(float)) == 0);
        ck_assert(memcmp(bits, bits0, nb) == 0);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
        free(err);
    }
    free(bits0);
    free(bits);
}

START_TEST(server_rejects)
{
    struct rng r = {31337};
    const float bad_scales[] = {-1.0f, -FLT_TRUE_MIN, NAN,
                                -NAN,  INFINITY,      -INFINITY};
    const float bad_err[] = {NAN, INFINITY, -INFINITY};

    for (size_t z = 0; z < NSIZES; z++) {
        int n = world_sizes[z];
        size_t chunk = obd_codec_padded_len(1000, n) / (size_t)n;
        struct server_in s;

        server_in_init(&s, &r, n, chunk);
        for (size_t b = 0; b < sizeof(bad_scales) / sizeof(float); b++) {
            int k = (int)(b % (size_t)n);
            float keep = s.scales[k];
            s.scales[k] = bad_scales[b];
            expect_server_rejects(&s);
            s.scales[k] = keep;
        }
        for (size_t b = 0; b < sizeof(bad_err) / sizeof(float); b++) {
            size_t pos[] = {0, chunk / 2 + 1, chunk - 1};
            for (size_t p = 0; p < 3; p++) {
                float keep = s.err[pos[p]];
                s.err[pos[p]] = bad_err[b];
                expect_server_rejects(&s);
                s.err[pos[p]] = keep;
            }
        }
        /* Finite scales whose sum overflows (n >= 2): every participant
         * votes +1 for element 0 with scale 3e38. */
        if (n >= 2) {
            for (int k = 0; k < n; k++) {
                s.scales[k] = 3e38f;
                s.bits[k][0] |= 0x80;
            }
            expect_server_rejects(&s);
        }
        server_in_fini(&s);
    }
}
END_TEST

/* ---- Decompress -------------------------------------------------------- */

START_TEST(decompress_vs_reference)
{
    struct rng r = {4242};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const float scales[] = {0.75f, 0.0f, -0.0f, 3e38f, 0x1p-140f};

    for (size_t c = 0; c < NCOUNTS; c++)
        for (size_t v = 0; v < sizeof(scales) / sizeof(float); v++) {
            size_t elems = counts[c];
            size_t nb = obd_codec_packed_bytes(elems);
            uint8_t *bits = xmalloc(nb);
            float *base = xmalloc((elems + 1) * sizeof(float));
            float *ref = xmalloc(elems * sizeof(float));
            float *out = base + 1; /* unaligned on purpose */

            fill_bytes(&r, bits, nb);
            for (int k = 0; k < ni; k++) {
                ref_decompress(bits, scales[v], ref, elems, 0);
                memset(out, 0xee, elems * sizeof(float));
                im[k]->decompress(bits, scales[v], out, elems);
                ck_assert(memcmp(out, ref, elems * sizeof(float)) == 0);

                fill_unit(&r, ref, elems, 2.0f);
                memcpy(out, ref, elems * sizeof(float));
                ref_decompress(bits, scales[v], ref, elems, 1);
                im[k]->decompress_add(bits, scales[v], out, elems);
                ck_assert(memcmp(out, ref, elems * sizeof(float)) == 0);
            }
            free(ref);
            free(base);
            free(bits);
        }
}
END_TEST

/* ---- Portable against AVX2, bit for bit ------------------------------- */

static void fill_mixed(struct rng *r, float *a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (rng_next(r) % 8) {
        case 0:
            a[i] = 0.0f;
            break;
        case 1:
            a[i] = -0.0f;
            break;
        case 2:
            a[i] = rng_unit(r) * 0x1p-135f; /* denormal */
            break;
        case 3:
            a[i] = rng_unit(r) * 1e30f;
            break;
        default:
            a[i] = rng_unit(r);
        }
    }
}

START_TEST(portable_equals_avx2)
{
    const struct obd_codec_impl *P = obd_codec_portable();
    const struct obd_codec_impl *V = obd_codec_avx2();
    struct rng r = {0xabcdefu};

    if (V == NULL)
        return; /* Nothing to compare on this CPU. */

    /* Whole-tensor helpers over all sizes, random and mixed inputs. */
    for (size_t c = 0; c < NCOUNTS; c++)
        for (size_t z = 0; z < NSIZES; z++)
            for (int mixed = 0; mixed < 2; mixed++) {
                int n = world_sizes[z];
                size_t count = counts[c];
                size_t N = obd_codec_padded_len(count, n);
                float *x = xmalloc((count + 1) * sizeof(float));
                float *e0 = xmalloc(N * sizeof(float));
                float *ep, *ev, sp, sv;
                uint8_t *bp = xmalloc(N / 8), *bv = xmalloc(N / 8);

                if (mixed) {
                    fill_mixed(&r, x + 1, count);
                    fill_mixed(&r, e0, N);
                } else {
                    fill_unit(&r, x + 1, count, 1.0f);
                    fill_unit(&r, e0, N, 0.2f);
                }
                ep = fdup(e0, N);
                ev = fdup(e0, N);
                /* x + 1: unaligned loads. */
                ck_assert_int_eq(
                    obd_codec_compress(P, x + 1, count, ep, N, bp, &sp), 0);
                ck_assert_int_eq(
                    obd_codec_compress(V, x + 1, count, ev, N, bv, &sv), 0);
                ck_assert(memcmp(&sp, &sv, sizeof(float)) == 0);
                ck_assert(memcmp(bp, bv, N / 8) == 0);
                ck_assert(memcmp(ep, ev, N * sizeof(float)) == 0);

                /* The server step on n copies of shifted worker bits. */
                {
                    size_t chunk = N / (size_t)n;
                    const uint8_t *in[16];
                    float scales[16], *gp, *gv, tp, tv;
                    uint8_t *op = xmalloc(chunk / 8), *ov = xmalloc(chunk / 8);

                    for (int k = 0; k < n; k++) {
                        in[k] = bp + (size_t)k * chunk / 8;
                        scales[k] = sp * (float)(k + 1) * 0.37f;
                    }
                    gp = fdup(ep, chunk);
                    gv = fdup(ep, chunk);
                    ck_assert_int_eq(
                        obd_codec_server(P, in, scales, n, gp, chunk, op, &tp),
                        0);
                    ck_assert_int_eq(
                        obd_codec_server(V, in, scales, n, gv, chunk, ov, &tv),
                        0);
                    ck_assert(memcmp(&tp, &tv, sizeof(float)) == 0);
                    ck_assert(memcmp(op, ov, chunk / 8) == 0);
                    ck_assert(memcmp(gp, gv, chunk * sizeof(float)) == 0);
                    free(gv);
                    free(gp);
                    free(ov);
                    free(op);
                }
                free(bv);
                free(bp);
                free(ev);
                free(ep);
                free(e0);
                free(x);
            }

    /* Range functions at begin offsets that are multiples of 8 but not of
     * 16 or 32, with ends anywhere, and x ending inside the range. */
    {
        const size_t len = 3000;
        float *x = xmalloc((len + 1) * sizeof(float));
        float *e = xmalloc((len + 1) * sizeof(float));
        uint8_t *bits = xmalloc(len / 8 + 1);
        const size_t begins[] = {0, 8, 24, 40, 1000};
        const size_t spans[] = {1, 7, 8, 15, 16, 17, 31, 33, 100, 1001};
        const size_t xcounts[] = {0, 1, 9, 1017, 1500, len};

        fill_mixed(&r, x + 1, len);
        fill_mixed(&r, e + 1, len);
        fill_bytes(&r, bits, len / 8 + 1);
        for (size_t b = 0; b < 5; b++)
            for (size_t s = 0; s < 10; s++)
                for (size_t xc = 0; xc < 6; xc++) {
                    size_t beg = begins[b], end = beg + spans[s];
                    size_t cnt = xcounts[xc];
                    double dp, dv;

                    dp = P->sumsq_block(x + 1, cnt, e + 1, beg, end);
                    dv = V->sumsq_block(x + 1, cnt, e + 1, beg, end);
                    ck_assert(memcmp(&dp, &dv, sizeof(double)) == 0);
                    if (spans[s] % 8 == 0) {
                        float *ep = fdup(e + 1, len), *ev = fdup(e + 1, len);
                        uint8_t op[200], ov[200];
                        P->compress_range(x + 1, cnt, ep, beg, end, 0.3f, op);
                        V->compress_range(x + 1, cnt, ev, beg, end, 0.3f, ov);
                        ck_assert(memcmp(op, ov, spans[s] / 8) == 0);
                        ck_assert(memcmp(ep, ev, len * sizeof(float)) == 0);
                        free(ev);
                        free(ep);
                    }
                    if (xc == 0) {
                        const uint8_t *in[3] = {bits, bits + 7, bits + 100};
                        float sc[3] = {0.5f, 1.25f, 0.0f};
                        for (int n = 1; n <= 3; n++) {
                            dp = P->server_sumsq_block(in, sc, n, e + 1, beg,
                                                       end);
                            dv = V->server_sumsq_block(in, sc, n, e + 1, beg,
                                                       end);
                            ck_assert(memcmp(&dp, &dv, sizeof(double)) == 0);
                            if (spans[s] % 8 == 0) {
                                float *gp = fdup(e + 1, len);
                                float *gv = fdup(e + 1, len);
                                uint8_t op[200], ov[200];
                                P->server_range(in, sc, n, gp, beg, end, 0.7f,
                                                op);
                                V->server_range(in, sc, n, gv, beg, end, 0.7f,
                                                ov);
                                ck_assert(memcmp(op, ov, spans[s] / 8) == 0);
                                ck_assert(memcmp(gp, gv, len * sizeof(float)) ==
                                          0);
                                free(gv);
                                free(gp);
                            }
                        }
                    }
                }
        free(bits);
        free(e);
        free(x);
    }

    /* Non-finite input is rejected by both. */
    {
        float x[40] = {0}, e[40] = {0}, s1, s2;
        uint8_t b1[5], b2[5];
        x[37] = NAN;
        ck_assert_int_eq(obd_codec_compress(P, x, 38, e, 40, b1, &s1),
                         OBD_CODEC_ENONFINITE);
        ck_assert_int_eq(obd_codec_compress(V, x, 38, e, 40, b2, &s2),
                         OBD_CODEC_ENONFINITE);
    }
}
END_TEST

/* ---- Worker compress over an average of local buffers ---------------- */

#define MAX_NSRC 4

/* nsrc source buffers of `count` elements each, allocated one float
 * further so that src[k] = base[k] + 1 is unaligned. */
struct avg_in {
    int nsrc;
    float *base[MAX_NSRC];
    const float *src[MAX_NSRC];
};

static void avg_in_init(struct avg_in *a, int nsrc, size_t count)
{
    a->nsrc = nsrc;
    for (int k = 0; k < nsrc; k++) {
        a->base[k] = xmalloc((count + 1) * sizeof(float));
        a->src[k] = a->base[k] + 1;
    }
}

static void avg_in_fini(struct avg_in *a)
{
    for (int k = 0; k < a->nsrc; k++)
        free(a->base[k]);
}

/* Compresses the average with every implementation and the reference:
 * bits exactly, the scale to SCALE_RTOL, the error to the bound of
 * assert_err_close, and the scratch b exactly equal to the reference's
 * fp32 average + e, which is fully specified. */
static void check_avg(const struct avg_in *a, size_t count, const float *e0,
                      size_t N)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    size_t nb = N / 8;
    uint8_t *rbits = xmalloc(nb), *bits = xmalloc(nb);
    float *re = fdup(e0, N), *rb = xmalloc(N * sizeof(float)), rscale;
    float *b = xmalloc(N * sizeof(float));

    memset(rbits, 0, nb);
    ck_assert_int_eq(
        ref_avg_worker(a->src, a->nsrc, count, re, N, rbits, &rscale, rb), 0);
    for (int k = 0; k < ni; k++) {
        float *e = fdup(e0, N), scale = -1.0f;
        memset(b, 0xee, N * sizeof(float));
        ck_assert_int_eq(obd_codec_compress_avg(im[k], a->src, a->nsrc, count,
                                                e, b, N, bits, &scale),
                         0);
        ck_assert_msg(memcmp(b, rb, N * sizeof(float)) == 0, "%s: b",
                      im[k]->name);
        ck_assert_msg(memcmp(bits, rbits, nb) == 0, "%s: bits", im[k]->name);
        assert_scale_close(scale, rscale);
        assert_err_close(e, re, N, scale, rscale);
        free(e);
    }
    free(b);
    free(rb);
    free(re);
    free(bits);
    free(rbits);
}

START_TEST(avg_vs_reference)
{
    static const int ns[] = {1, 2, 3, 5, 8};
    struct rng r = {0xa11ce};

    for (int nsrc = 1; nsrc <= MAX_NSRC; nsrc++)
        for (size_t z = 0; z < sizeof(ns) / sizeof(ns[0]); z++)
            for (size_t c = 0; c < NCOUNTS; c++) {
                size_t count = counts[c];
                size_t N = obd_codec_padded_len(count, ns[z]);
                float *e = xmalloc(N * sizeof(float));
                struct avg_in a;

                avg_in_init(&a, nsrc, count);
                for (int k = 0; k < nsrc; k++)
                    fill_unit(&r, a.base[k] + 1, count, 1.0f + (float)k);
                fill_unit(&r, e, N, 0.5f);
                check_avg(&a, count, e, N);
                /* Fresh state: the error starts at zero. */
                memset(e, 0, N * sizeof(float));
                check_avg(&a, count, e, N);
                avg_in_fini(&a);
                free(e);
            }
}
END_TEST

/* With one source the average is the source itself: the fused path must
 * give byte for byte what obd_codec_compress gives, and its pass 1 must
 * return exactly sumsq_block's block sums. */
START_TEST(avg_one_equals_compress)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    struct rng r = {0xb0b};

    for (int k = 0; k < ni; k++)
        for (size_t c = 0; c < NCOUNTS; c++)
            for (size_t z = 0; z < NSIZES; z++)
                for (int mixed = 0; mixed < 2; mixed++) {
                    size_t count = counts[c];
                    size_t N = obd_codec_padded_len(count, world_sizes[z]);
                    float *x = xmalloc(count * sizeof(float));
                    float *e0 = xmalloc(N * sizeof(float));
                    float *b = xmalloc(N * sizeof(float));
                    uint8_t *b1 = xmalloc(N / 8), *b2 = xmalloc(N / 8);
                    const float *src[1] = {x};
                    float *e1, *e2, s1, s2;

                    if (mixed) {
                        fill_mixed(&r, x, count);
                        fill_mixed(&r, e0, N);
                    } else {
                        fill_unit(&r, x, count, 2.0f);
                        fill_unit(&r, e0, N, 0.3f);
                    }
                    e1 = fdup(e0, N);
                    e2 = fdup(e0, N);
                    for (size_t j = 0; j < N; j += OBD_CODEC_BLOCK) {
                        size_t end =
                            N - j < OBD_CODEC_BLOCK ? N : j + OBD_CODEC_BLOCK;
                        double d1 = im[k]->sumsq_block(x, count, e0, j, end);
                        double d2 = im[k]->avg_sumsq_block(src, 1, count, e0, j,
                                                           end, b);
                        ck_assert(memcmp(&d1, &d2, sizeof(double)) == 0);
                    }
                    ck_assert_int_eq(
                        obd_codec_compress(im[k], x, count, e1, N, b1, &s1), 0);
                    ck_assert_int_eq(obd_codec_compress_avg(im[k], src, 1,
                                                            count, e2, b, N, b2,
                                                            &s2),
                                     0);
                    ck_assert(memcmp(&s1, &s2, sizeof(float)) == 0);
                    ck_assert(memcmp(b1, b2, N / 8) == 0);
                    ck_assert(memcmp(e1, e2, N * sizeof(float)) == 0);
                    free(e2);
                    free(e1);
                    free(b2);
                    free(b1);
                    free(b);
                    free(e0);
                    free(x);
                }
}
END_TEST

/* compress_avg must fail with ENONFINITE and leave e, bits and scale
 * exactly as they were (the scratch b may be overwritten). */
static void expect_avg_rejects(const struct avg_in *a, size_t count,
                               const float *e0, size_t N)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    uint8_t *bits = xmalloc(N / 8), *bits0 = xmalloc(N / 8);
    float *re = fdup(e0, N), *b = xmalloc(N * sizeof(float)), rs;

    memset(bits0, 0xa5, N / 8);
    ck_assert_int_eq(
        ref_avg_worker(a->src, a->nsrc, count, re, N, bits0, &rs, b), -1);
    for (int k = 0; k < ni; k++) {
        float *e = fdup(e0, N), sc = 1234.5f, sc0 = 1234.5f;
        memcpy(bits, bits0, N / 8);
        ck_assert_int_eq(obd_codec_compress_avg(im[k], a->src, a->nsrc, count,
                                                e, b, N, bits, &sc),
                         OBD_CODEC_ENONFINITE);
        ck_assert(memcmp(e, e0, N * sizeof(float)) == 0);
        ck_assert(memcmp(bits, bits0, N / 8) == 0);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
        free(e);
    }
    free(b);
    free(re);
    free(bits0);
    free(bits);
}

START_TEST(avg_nonfinite)
{
    struct rng r = {0xdead};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};

    for (int nsrc = 1; nsrc <= MAX_NSRC; nsrc++)
        for (size_t c = 0; c < NCOUNTS; c++) {
            size_t count = counts[c], N = obd_codec_padded_len(count, 3);
            float *e = xmalloc(N * sizeof(float));
            size_t xpos[] = {0, count / 2, count - 1};
            size_t epos[] = {0, count - 1, count, N - 1};
            struct avg_in a;

            avg_in_init(&a, nsrc, count);
            for (int k = 0; k < nsrc; k++)
                fill_unit(&r, a.base[k] + 1, count, 1.0f);
            fill_unit(&r, e, N, 0.1f);
            for (size_t v = 0; v < 4; v++) {
                /* In every source, at the start, middle and end. */
                for (int k = 0; k < nsrc; k++)
                    for (size_t p = 0; p < 3; p++) {
                        float *x = a.base[k] + 1, keep = x[xpos[p]];
                        x[xpos[p]] = bad[v];
                        expect_avg_rejects(&a, count, e, N);
                        x[xpos[p]] = keep;
                    }
                /* In e, including the padding tail past count. */
                for (size_t p = 0; p < 4; p++) {
                    float keep = e[epos[p]];
                    e[epos[p]] = bad[v];
                    expect_avg_rejects(&a, count, e, N);
                    e[epos[p]] = keep;
                }
            }
            /* Finite sources whose fp32 sum overflows before the division
             * (the exact average would be finite): nsrc >= 2. With one
             * source, a finite average plus a finite e overflowing. */
            {
                size_t p = count - 1;
                float *x0 = a.base[0] + 1, *xl = a.base[nsrc - 1] + 1;
                float k0 = x0[p], kl = xl[p], ke = e[p];
                for (int sgn = -1; sgn <= 1; sgn += 2) {
                    x0[p] = (float)sgn * 3e38f;
                    xl[p] = (float)sgn * 3e38f;
                    if (nsrc == 1)
                        e[p] = (float)sgn * 3e38f;
                    expect_avg_rejects(&a, count, e, N);
                }
                x0[p] = k0;
                xl[p] = kl;
                e[p] = ke;
            }
            avg_in_fini(&a);
            free(e);
        }
}
END_TEST

START_TEST(avg_invalid_sizes)
{
    const struct obd_codec_impl *p = obd_codec_portable();
    float x[16] = {0}, e[16] = {0}, b[16], sc = 7.0f;
    const float *src[1] = {x};
    uint8_t bits[2] = {0x5a, 0x5a};

    memset(b, 0x11, sizeof(b));
    ck_assert_int_eq(obd_codec_compress_avg(p, src, 0, 1, e, b, 8, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_compress_avg(p, src, 1, 1, e, b, 0, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_compress_avg(p, src, 1, 1, e, b, 12, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert_int_eq(obd_codec_compress_avg(p, src, 1, 17, e, b, 16, bits, &sc),
                     OBD_CODEC_EINVAL);
    ck_assert(sc == 7.0f);
    ck_assert_uint_eq(bits[0], 0x5a);
    for (size_t i = 0; i < 16; i++) {
        uint32_t u;
        memcpy(&u, &b[i], sizeof(u));
        ck_assert_uint_eq(u, 0x11111111u);
        ck_assert(e[i] == 0.0f);
    }
}
END_TEST

/* The range functions, portable against AVX2 bit for bit: whole
 * tensors for every nsrc, then ranges at begin offsets that are multiples
 * of 8 but not of 16 or 32, with ends anywhere and the sources ending
 * inside the range. */
START_TEST(avg_portable_equals_avx2)
{
    const struct obd_codec_impl *P = obd_codec_portable();
    const struct obd_codec_impl *V = obd_codec_avx2();
    static const int ns[] = {1, 3, 8};
    struct rng r = {0xfaceu};

    if (V == NULL)
        return; /* Nothing to compare on this CPU. */

    for (int nsrc = 1; nsrc <= MAX_NSRC; nsrc++)
        for (size_t c = 0; c < NCOUNTS; c++)
            for (size_t z = 0; z < sizeof(ns) / sizeof(ns[0]); z++)
                for (int mixed = 0; mixed < 2; mixed++) {
                    size_t count = counts[c];
                    size_t N = obd_codec_padded_len(count, ns[z]);
                    float *e0 = xmalloc(N * sizeof(float));
                    float *bp = xmalloc(N * sizeof(float));
                    float *bv = xmalloc(N * sizeof(float));
                    uint8_t *op = xmalloc(N / 8), *ov = xmalloc(N / 8);
                    float *ep, *ev, sp, sv;
                    struct avg_in a;

                    avg_in_init(&a, nsrc, count);
                    for (int k = 0; k < nsrc; k++)
                        if (mixed)
                            fill_mixed(&r, a.base[k] + 1, count);
                        else
                            fill_unit(&r, a.base[k] + 1, count, 1.0f);
                    if (mixed)
                        fill_mixed(&r, e0, N);
                    else
                        fill_unit(&r, e0, N, 0.2f);
                    ep = fdup(e0, N);
                    ev = fdup(e0, N);
                    ck_assert_int_eq(obd_codec_compress_avg(P, a.src, nsrc,
                                                            count, ep, bp, N,
                                                            op, &sp),
                                     0);
                    ck_assert_int_eq(obd_codec_compress_avg(V, a.src, nsrc,
                                                            count, ev, bv, N,
                                                            ov, &sv),
                                     0);
                    ck_assert(memcmp(&sp, &sv, sizeof(float)) == 0);
                    ck_assert(memcmp(op, ov, N / 8) == 0);
                    ck_assert(memcmp(ep, ev, N * sizeof(float)) == 0);
                    ck_assert(memcmp(bp, bv, N * sizeof(float)) == 0);
                    avg_in_fini(&a);
                    free(ev);
                    free(ep);
                    free(ov);
                    free(op);
                    free(bv);
                    free(bp);
                    free(e0);
                }

    {
        const size_t len = 3000;
        float *e = xmalloc((len + 1) * sizeof(float));
        float *b0 = xmalloc(len * sizeof(float));
        float *bp = xmalloc(len * sizeof(float));
        float *bv = xmalloc(len * sizeof(float));
        const size_t begins[] = {0, 8, 24, 40, 1000};
        const size_t spans[] = {1, 7, 8, 15, 16, 17, 31, 33, 100, 1001};
        const size_t xcounts[] = {0, 1, 9, 1017, 1500, len};
        struct avg_in a;

        avg_in_init(&a, MAX_NSRC, len);
        for (int k = 0; k < MAX_NSRC; k++)
            fill_mixed(&r, a.base[k] + 1, len);
        fill_mixed(&r, e + 1, len);
        fill_mixed(&r, b0, len);
        for (int nsrc = 1; nsrc <= MAX_NSRC; nsrc++)
            for (size_t bg = 0; bg < 5; bg++)
                for (size_t s = 0; s < 10; s++)
                    for (size_t xc = 0; xc < 6; xc++) {
                        size_t beg = begins[bg], end = beg + spans[s];
                        size_t cnt = xcounts[xc];
                        double dp, dv;

                        memcpy(bp, b0, len * sizeof(float));
                        memcpy(bv, b0, len * sizeof(float));
                        dp = P->avg_sumsq_block(a.src, nsrc, cnt, e + 1, beg,
                                                end, bp);
                        dv = V->avg_sumsq_block(a.src, nsrc, cnt, e + 1, beg,
                                                end, bv);
                        ck_assert(memcmp(&dp, &dv, sizeof(double)) == 0);
                        /* Equal everywhere: the range written alike, and
                         * nothing outside it written at all. */
                        ck_assert(memcmp(bp, bv, len * sizeof(float)) == 0);
                        ck_assert(memcmp(bp, b0, beg * sizeof(float)) == 0);
                        ck_assert(memcmp(bp + end, b0 + end,
                                         (len - end) * sizeof(float)) == 0);
                        if (nsrc == 1) {
                            double dx =
                                P->sumsq_block(a.src[0], cnt, e + 1, beg, end);
                            ck_assert(memcmp(&dp, &dx, sizeof(double)) == 0);
                        }
                        if (spans[s] % 8 == 0) {
                            float *gp = fdup(e + 1, len),
                                  *gv = fdup(e + 1, len);
                            uint8_t sp[200], sv[200];
                            P->sign_range(bp, gp, beg, end, 0.3f, sp);
                            V->sign_range(bp, gv, beg, end, 0.3f, sv);
                            ck_assert(memcmp(sp, sv, spans[s] / 8) == 0);
                            ck_assert(memcmp(gp, gv, len * sizeof(float)) == 0);
                            free(gv);
                            free(gp);
                        }
                    }
        avg_in_fini(&a);
        free(bv);
        free(bp);
        free(b0);
        free(e);
    }
}
END_TEST

START_TEST(dispatch)
{
    const struct obd_codec_impl *b = obd_codec_best();

    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_eq(b, obd_codec_best());
    if (obd_codec_avx2() != NULL && getenv("OBCOMM_CODEC") == NULL)
        ck_assert_str_eq(b->name, "avx2");
    else
        ck_assert_str_eq(b->name, "portable");
    ck_assert_str_eq(obd_codec_portable()->name, "portable");
}
END_TEST

/* ---- Error-feedback conservation over many steps ---------------------- */

/* One rounding of a sum of two floats and one of b -+ scale separate
 * x + e_old from scale * s + e_new, each at most half an ulp of its
 * result, so
 *   |x + e_old - (scale * s + e_new)| <= 2^-24 * (|x + e_old| + |e_new|)
 * up to the rounding of |x + e_old| itself; the check allows
 * FLT_EPSILON * (|b| + |e_new|) + FLT_TRUE_MIN (twice that, plus the
 * smallest denormal), evaluated exactly in double. */
START_TEST(worker_conservation)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const size_t sizes[] = {63, 1000003};

    for (int k = 0; k < ni; k++)
        for (size_t c = 0; c < 2; c++) {
            struct rng r = {555 + c};
            size_t count = sizes[c], N = obd_codec_padded_len(count, 3);
            float *x = xmalloc(count * sizeof(float));
            float *e = xmalloc(N * sizeof(float));
            float *eold = xmalloc(N * sizeof(float));
            uint8_t *bits = xmalloc(N / 8);

            memset(e, 0, N * sizeof(float));
            for (int step = 0; step < 50; step++) {
                float sc;
                fill_unit(&r, x, count, 1.0f + (float)step);
                memcpy(eold, e, N * sizeof(float));
                ck_assert_int_eq(
                    obd_codec_compress(im[k], x, count, e, N, bits, &sc), 0);
                for (size_t i = 0; i < N; i++) {
                    double xi = i < count ? x[i] : 0.0;
                    double lhs = xi + (double)eold[i];
                    double s = ((bits[i / 8] >> (7 - i % 8)) & 1) ? 1 : -1;
                    double rhs = (double)sc * s + (double)e[i];
                    double b = (float)(xi + eold[i]);
                    double tol = FLT_EPSILON * (fabs(b) + fabs((double)e[i])) +
                                 FLT_TRUE_MIN;
                    EXPECT(fabs(lhs - rhs) <= tol, "step %d elem %zu: %a vs %a",
                           step, i, lhs, rhs);
                }
            }
            free(bits);
            free(eold);
            free(e);
            free(x);
        }
}
END_TEST

/* The server's m = (sum of +-scale_k) / n + err_old carries three roundings
 * (the fp32 sum of n terms, the division, the add) before the subtraction
 * of sscale. With A = sum of scale_k, each is at most 2^-24 times a
 * quantity bounded by A + |m| + |e_new|; the check allows
 *   |exact avg + err_old - (sscale * t + err_new)|
 *       <= n * FLT_EPSILON * (A + |m| + |e_new|) + FLT_TRUE_MIN. */
START_TEST(server_conservation)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const int ns[] = {2, 3, 8};

    for (int k = 0; k < ni; k++)
        for (size_t z = 0; z < 3; z++) {
            struct rng r = {777 + z};
            int n = ns[z];
            size_t chunk = obd_codec_padded_len(200003, n) / (size_t)n;
            struct server_in s;
            float *eold = xmalloc(chunk * sizeof(float));
            uint8_t *bits = xmalloc(chunk / 8);

            server_in_init(&s, &r, n, chunk);
            memset(s.err, 0, chunk * sizeof(float));
            for (int step = 0; step < 50; step++) {
                float sc;
                double A = 0.0;
                for (int q = 0; q < n; q++) {
                    fill_bytes(&r, s.bits[q], chunk / 8);
                    s.scales[q] = (float)(0.1 + (rng_next(&r) >> 11) * 0x1p-53);
                    A += s.scales[q];
                }
                memcpy(eold, s.err, chunk * sizeof(float));
                ck_assert_int_eq(obd_codec_server(im[k], s.in, s.scales, n,
                                                  s.err, chunk, bits, &sc),
                                 0);
                for (size_t i = 0; i < chunk; i++) {
                    double avg = 0.0;
                    for (int q = 0; q < n; q++)
                        avg += (ref_bit(s.in[q], i) ? 1 : -1) *
                               (double)s.scales[q];
                    avg /= n;
                    double lhs = avg + (double)eold[i];
                    double t = ref_bit(bits, i) ? 1 : -1;
                    double rhs = (double)sc * t + (double)s.err[i];
                    double tol = n * FLT_EPSILON *
                                     (A + fabs(lhs) + fabs((double)s.err[i])) +
                                 FLT_TRUE_MIN;
                    EXPECT(fabs(lhs - rhs) <= tol,
                           "n %d step %d elem %zu: %a vs %a", n, step, i, lhs,
                           rhs);
                }
            }
            free(bits);
            free(eold);
            server_in_fini(&s);
        }
}
END_TEST

/* ---- A whole multi-participant round against the reference ------------ */

/* n workers with their own x and error state run steps 1-5 through the
 * codec (compress, n server steps, decompress into every participant's
 * output) and through the reference, from the same state. Output elements
 * must equal the reference's +-sscale_r to SCALE_RTOL. The one allowed
 * difference is a server sign where the reference's m_i is so close to
 * zero that the worker scales' rounding (SCALE_RTOL each) could flip it:
 * |m_i| <= 4 * SCALE_RTOL * (max scale_k + |err_i|). Such elements are
 * counted and must be rare. The codec's state then seeds the next round of
 * both, so every round is compared from identical inputs. */
START_TEST(full_round_vs_reference)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);

    for (int k = 0; k < ni; k++)
        for (size_t c = 0; c < NCOUNTS; c++)
            for (size_t z = 0; z < NSIZES; z++) {
                struct rng r = {1000 + c * 31 + z};
                int n = world_sizes[z];
                size_t count = counts[c];
                size_t N = obd_codec_padded_len(count, n);
                size_t chunk = N / (size_t)n;
                int rounds = count > 100000 ? 2 : 5;
                float *x[16], *we[16], *se[16], mult[16];
                uint8_t *wb[16], *sb[16], *rwb = xmalloc(N / 8);
                uint8_t *rsb = xmalloc(chunk / 8);
                float *out = xmalloc(N * sizeof(float));
                float *rout = xmalloc(N * sizeof(float));
                float *rwe = xmalloc(N * sizeof(float));
                float *rse = xmalloc(chunk * sizeof(float));
                float *rm = xmalloc(chunk * sizeof(float));
                size_t ambiguous = 0;

                for (int q = 0; q < n; q++) {
                    x[q] = xmalloc(count * sizeof(float));
                    we[q] = xmalloc(N * sizeof(float));
                    se[q] = xmalloc(chunk * sizeof(float));
                    wb[q] = xmalloc(N / 8);
                    sb[q] = xmalloc(chunk / 8);
                    memset(we[q], 0, N * sizeof(float));
                    memset(se[q], 0, chunk * sizeof(float));
                    mult[q] = 0.5f + (float)(rng_next(&r) >> 40) * 0x1p-24f;
                }
                for (int round = 0; round < rounds; round++) {
                    float ws[16], rws[16], ss[16], rss;

                    for (int q = 0; q < n; q++)
                        fill_unit(&r, x[q], count, mult[q]);
                    /* Steps 1-3 on every worker, codec and reference. */
                    for (int q = 0; q < n; q++) {
                        memcpy(rwe, we[q], N * sizeof(float));
                        ck_assert_int_eq(
                            ref_worker(x[q], count, rwe, N, rwb, &rws[q]), 0);
                        ck_assert_int_eq(obd_codec_compress(im[k], x[q], count,
                                                            we[q], N, wb[q],
                                                            &ws[q]),
                                         0);
                        ck_assert(memcmp(rwb, wb[q], N / 8) == 0);
                        assert_scale_close(ws[q], rws[q]);
                        assert_err_close(we[q], rwe, N, ws[q], rws[q]);
                    }
                    /* Step 4 on every server; step 5 decompresses each
                     * server's chunk into the shared output. */
                    for (int s = 0; s < n; s++) {
                        const uint8_t *in[16];
                        size_t off = (size_t)s * chunk;

                        /* The workers' bits were checked equal to the
                         * reference's; the scales differ by rounding. */
                        for (int q = 0; q < n; q++)
                            in[q] = wb[q] + off / 8;
                        memcpy(rse, se[s], chunk * sizeof(float));
                        ck_assert_int_eq(
                            ref_server(in, rws, n, rse, chunk, rsb, &rss, rm),
                            0);
                        ck_assert_int_eq(obd_codec_server(im[k], in, ws, n,
                                                          se[s], chunk, sb[s],
                                                          &ss[s]),
                                         0);
                        assert_scale_close(ss[s], rss);
                        im[k]->decompress(sb[s], ss[s], out + off, chunk);
                        ref_decompress(rsb, rss, rout + off, chunk, 0);
                        float maxs = 0.0f;
                        for (int q = 0; q < n; q++)
                            maxs = fmaxf(maxs, rws[q]);
                        for (size_t i = 0; i < chunk; i++) {
                            if (ref_bit(sb[s], i) == ref_bit(rsb, i))
                                continue;
                            double lim = 4 * SCALE_RTOL *
                                         (maxs + fabs((double)se[s][i]));
                            EXPECT(fabs((double)rm[i]) <= lim,
                                   "sign of m[%zu] = %a differs", i,
                                   (double)rm[i]);
                            ambiguous++;
                            rout[off + i] = -rout[off + i];
                        }
                    }
                    for (size_t i = 0; i < count; i++) {
                        double g = out[i], w = rout[i];
                        EXPECT(fabs(g - w) <= SCALE_RTOL * fabs(w),
                               "out[%zu] = %a, ref %a", i, g, w);
                    }
                }
                ck_assert_uint_le(ambiguous, count / 1000 + 2);
                for (int q = 0; q < n; q++) {
                    free(sb[q]);
                    free(wb[q]);
                    free(se[q]);
                    free(we[q]);
                    free(x[q]);
                }
                free(rm);
                free(rse);
                free(rwe);
                free(rout);
                free(out);
                free(rsb);
                free(rwb);
            }
}
END_TEST

/* ---- Lazy error feedback (the single-pass steps) ---------------------- */

/* A lazy state for the tests: obd_codec_lazy_state over buffers this
 * owns, RESET (in place) or ROLLBACK (two buffers). `off` shifts both
 * buffers by that many floats inside their allocations, so the kernels
 * meet every alignment (and hence every kind of store). */
struct lstate {
    float *mem[2];
    struct obd_codec_lazy_state st;
    size_t n;
};

static void lstate_init(struct lstate *s, size_t n, int inplace, size_t off)
{
    for (int k = 0; k < 2; k++) {
        s->mem[k] = xmalloc((n + 8) * sizeof(float));
        memset(s->mem[k], 0x7f, (n + 8) * sizeof(float)); /* NaN-free junk */
    }
    obd_codec_lazy_state_init(
        &s->st, inplace ? OBD_CODEC_LAZY_RESET : OBD_CODEC_LAZY_ROLLBACK,
        s->mem[0] + off, inplace ? NULL : s->mem[1] + off);
    s->n = n;
}

static void lstate_fini(struct lstate *s)
{
    free(s->mem[0]);
    free(s->mem[1]);
}

static void lstate_restore(struct lstate *s, const float *e)
{
    obd_codec_lazy_state_restore(&s->st, e, s->n);
}

static struct obd_codec_lazy lstate_prev(const struct lstate *s)
{
    return obd_codec_lazy_state_prev(&s->st);
}

static float *lstate_next(struct lstate *s)
{
    return obd_codec_lazy_state_next(&s->st);
}

static void lstate_commit(struct lstate *s, float scale)
{
    obd_codec_lazy_state_commit(&s->st, scale);
}

/* The state's error, as a snapshot would store it. */
static void lstate_error(const struct obd_codec_impl *im,
                         const struct lstate *s, float *e)
{
    struct obd_codec_lazy st = lstate_prev(s);

    im->lazy_error(&st, e, 0, s->n);
}

static int lstate_worker(const struct obd_codec_impl *im, struct lstate *s,
                         const float *const *src, int nsrc, size_t count,
                         uint8_t *bits, float *scale)
{
    struct obd_codec_lazy prev = lstate_prev(s);
    int rc = obd_codec_lazy_compress(im, src, nsrc, count, &prev,
                                     lstate_next(s), s->n, bits, scale);
    if (rc == 0)
        lstate_commit(s, *scale);
    return rc;
}

static int lstate_server(const struct obd_codec_impl *im, struct lstate *s,
                         const uint8_t *const *in, const float *scales, int n,
                         uint8_t *bits, float *sscale)
{
    struct obd_codec_lazy prev = lstate_prev(s);
    int rc = obd_codec_lazy_server(im, in, scales, n, &prev, lstate_next(s),
                                   s->n, bits, sscale);
    if (rc == 0)
        lstate_commit(s, *sscale);
    return rc;
}

static void expect_same_floats(const float *a, const float *b, size_t n,
                               const char *what, int step)
{
    for (size_t i = 0; i < n; i++)
        EXPECT(memcmp(&a[i], &b[i], sizeof(float)) == 0,
               "step %d: %s[%zu] = %a, eager %a", step, what, i, (double)a[i],
               (double)b[i]);
}

/* Three lazy states (double-buffered aligned, double-buffered at odd
 * offsets, in place) against the eager functions over `steps` steps of
 * fresh random inputs: bits, scale and the materialised error must be
 * byte-identical after every step. Mid-way the first state is
 * snapshotted (its error) and restored into a fresh state, which must
 * carry on identically. `e0` NULL starts from zero (mode ZERO), else from
 * a restored e0 (mode EAGER). */
static void check_lazy_worker(const struct obd_codec_impl *im, size_t count,
                              size_t N, int nsrc, const float *e0, int steps,
                              struct rng *r)
{
    float *src_mem[3], *e = xmalloc(N * sizeof(float));
    float *b = xmalloc(N * sizeof(float)), *le = xmalloc(N * sizeof(float));
    const float *src[3];
    uint8_t *bits = xmalloc(N / 8), *lbits = xmalloc(N / 8);
    struct lstate ls[3];
    const size_t offs[3] = {0, 1, 4};

    for (int k = 0; k < nsrc; k++) {
        src_mem[k] = xmalloc((count ? count : 1) * sizeof(float));
        src[k] = src_mem[k];
    }
    for (int t = 0; t < 3; t++) {
        lstate_init(&ls[t], N, t == 2, offs[t]);
        if (e0)
            lstate_restore(&ls[t], e0);
    }
    if (e0)
        memcpy(e, e0, N * sizeof(float));
    else
        memset(e, 0, N * sizeof(float));

    for (int step = 0; step < steps; step++) {
        float sc = 0.0f;

        for (int k = 0; k < nsrc; k++) {
            if (step % 3 == 2)
                fill_mixed(r, src_mem[k], count);
            else
                fill_unit(r, src_mem[k], count, 1.0f);
        }
        if (nsrc == 1)
            ck_assert_int_eq(
                obd_codec_compress(im, src[0], count, e, N, bits, &sc), 0);
        else
            ck_assert_int_eq(obd_codec_compress_avg(im, src, nsrc, count, e, b,
                                                    N, bits, &sc),
                             0);
        if (step == steps / 2) {
            /* Snapshot and restore: the error goes out and comes back in
             * the eager format, exactly. */
            lstate_error(im, &ls[0], le);
            lstate_fini(&ls[0]);
            lstate_init(&ls[0], N, 0, offs[0]);
            lstate_restore(&ls[0], le);
        }
        for (int t = 0; t < 3; t++) {
            float lsc = -1.0f;

            memset(lbits, 0xa5, N / 8);
            ck_assert_int_eq(
                lstate_worker(im, &ls[t], src, nsrc, count, lbits, &lsc), 0);
            ck_assert_msg(memcmp(&lsc, &sc, sizeof(float)) == 0,
                          "%s step %d state %d: scale %a, eager %a", im->name,
                          step, t, (double)lsc, (double)sc);
            ck_assert_msg(memcmp(lbits, bits, N / 8) == 0,
                          "%s step %d state %d: bits differ", im->name, step,
                          t);
            lstate_error(im, &ls[t], le);
            expect_same_floats(le, e, N, "e", step);
        }
    }
    for (int t = 0; t < 3; t++)
        lstate_fini(&ls[t]);
    for (int k = 0; k < nsrc; k++)
        free(src_mem[k]);
    free(lbits);
    free(bits);
    free(le);
    free(b);
    free(e);
}

START_TEST(lazy_worker_equals_eager)
{
    struct rng r = {0x1a2bu};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    /* Sizes around the 16-lane groups, the 8 KiB-of-bits norm block and
     * odd counts; large ones take fewer steps. */
    const size_t lcounts[] = {1, 7, 8, 9, 63, 200, 1000, 65536 + 24, 1000003};

    for (int k = 0; k < ni; k++)
        for (size_t c = 0; c < sizeof(lcounts) / sizeof(lcounts[0]); c++)
            for (int nsrc = 1; nsrc <= 3; nsrc++) {
                int n = (int)(c % 5) + 1; /* padding as for n nodes */
                size_t count = lcounts[c];
                size_t N = obd_codec_padded_len(count, n);
                int steps = count > 100000 ? 6 : 50;
                float *e0;

                if (nsrc == 3 && count > 100000)
                    continue;
                e0 = xmalloc(N * sizeof(float));
                check_lazy_worker(im[k], count, N, nsrc, NULL, steps, &r);
                fill_mixed(&r, e0, N);
                check_lazy_worker(im[k], count, N, nsrc, e0, steps, &r);
                free(e0);
            }
}
END_TEST

/* The server's counterpart: n participants, fresh bits and scales every
 * step (some steps with equal scales, so terms cancel to exact zeros, and
 * some with -0.0 scales). */
static void check_lazy_server(const struct obd_codec_impl *im, int n,
                              size_t chunk, const float *e0, int steps,
                              struct rng *r)
{
    uint8_t *bm[16], *bits = xmalloc(chunk / 8), *lbits = xmalloc(chunk / 8);
    const uint8_t *in[16];
    float scales[16], *err = xmalloc(chunk * sizeof(float));
    float *le = xmalloc(chunk * sizeof(float));
    struct lstate ls[3];
    const size_t offs[3] = {0, 3, 4};

    for (int k = 0; k < n; k++) {
        bm[k] = xmalloc(chunk / 8);
        in[k] = bm[k];
    }
    for (int t = 0; t < 3; t++) {
        lstate_init(&ls[t], chunk, t == 2, offs[t]);
        if (e0)
            lstate_restore(&ls[t], e0);
    }
    if (e0)
        memcpy(err, e0, chunk * sizeof(float));
    else
        memset(err, 0, chunk * sizeof(float));

    for (int step = 0; step < steps; step++) {
        float sc = 0.0f;

        for (int k = 0; k < n; k++) {
            fill_bytes(r, bm[k], chunk / 8);
            scales[k] = step % 7 == 3 ? 0.5f
                        : step % 7 == 5
                            ? -0.0f
                            : (float)(0.01 + (rng_next(r) >> 11) * 0x1p-53);
        }
        ck_assert_int_eq(
            obd_codec_server(im, in, scales, n, err, chunk, bits, &sc), 0);
        if (step == steps / 2) {
            lstate_error(im, &ls[0], le);
            lstate_fini(&ls[0]);
            lstate_init(&ls[0], chunk, 0, offs[0]);
            lstate_restore(&ls[0], le);
        }
        for (int t = 0; t < 3; t++) {
            float lsc = -1.0f;

            memset(lbits, 0xa5, chunk / 8);
            ck_assert_int_eq(
                lstate_server(im, &ls[t], in, scales, n, lbits, &lsc), 0);
            ck_assert_msg(memcmp(&lsc, &sc, sizeof(float)) == 0,
                          "%s n=%d step %d state %d: sscale %a, eager %a",
                          im->name, n, step, t, (double)lsc, (double)sc);
            ck_assert_msg(memcmp(lbits, bits, chunk / 8) == 0,
                          "%s n=%d step %d state %d: bits differ", im->name, n,
                          step, t);
            lstate_error(im, &ls[t], le);
            expect_same_floats(le, err, chunk, "server e", step);
        }
    }
    for (int t = 0; t < 3; t++)
        lstate_fini(&ls[t]);
    for (int k = 0; k < n; k++)
        free(bm[k]);
    free(le);
    free(err);
    free(lbits);
    free(bits);
}

START_TEST(lazy_server_equals_eager)
{
    struct rng r = {0x5e4e4u};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const size_t chunks[] = {8, 16, 24, 40, 1000, 65536 + 40, 250008};

    for (int k = 0; k < ni; k++)
        for (int n = 1; n <= 16; n++)
            for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
                size_t chunk = chunks[c];
                int steps = chunk > 100000 ? 4 : chunk > 1000 ? 10 : 50;
                float *e0;

                if (chunk > 100000 && n % 4 != 0)
                    continue;
                check_lazy_server(im[k], n, chunk, NULL, steps, &r);
                e0 = xmalloc(chunk * sizeof(float));
                fill_mixed(&r, e0, chunk);
                for (size_t i = 0; i < chunk; i++)
                    e0[i] *= 0x1p-40f; /* keep m finite */
                check_lazy_server(im[k], n, chunk, e0, steps, &r);
                free(e0);
            }
}
END_TEST

/* NaN or Inf anywhere, in a source or in a restored error: the step
 * returns OBD_CODEC_ENONFINITE, *scale is untouched and a double-buffered
 * state is untouched, so the next step (with good data) is exactly the
 * eager step that never saw the bad one. Also b overflowing from finite
 * inputs. */
START_TEST(lazy_worker_nonfinite)
{
    struct rng r = {0xbadu};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const size_t count = 61, N = 64;

    for (int k = 0; k < ni; k++)
        for (int nsrc = 1; nsrc <= 2; nsrc++)
            for (size_t pos = 0; pos < N; pos++)
                for (size_t v = 0; v < 5; v++) {
                    float x0[64], x1[64], good[64], e[64], b[64], le[64];
                    float *xs[2] = {x0, x1}, sc = 0.0f, lsc = 42.0f;
                    const float *src[2] = {x0, x1};
                    uint8_t bits[8], lbits[8];
                    struct lstate ls;
                    float *keep;
                    int where = (int)(pos % 3); /* 0, 1: a source; 2: e */

                    fill_unit(&r, x0, count, 1.0f);
                    fill_unit(&r, x1, count, 1.0f);
                    fill_unit(&r, e, N, 0.5f);
                    memcpy(good, x0, sizeof(good));
                    lstate_init(&ls, N, 0, pos % 2);
                    lstate_restore(&ls, e);
                    /* One good step, so the state is DEFERRED. */
                    ck_assert_int_eq(lstate_worker(im[k], &ls, src, nsrc, count,
                                                   lbits, &lsc),
                                     0);
                    if (nsrc == 1)
                        ck_assert_int_eq(obd_codec_compress(im[k], x0, count, e,
                                                            N, bits, &sc),
                                         0);
                    else
                        ck_assert_int_eq(obd_codec_compress_avg(im[k], src, 2,
                                                                count, e, b, N,
                                                                bits, &sc),
                                         0);
                    if (where == 2 || pos >= count) {
                        /* A corrupt restored error (past count only e can
                         * hold anything). */
                        struct lstate bad_st;
                        float e1[64];

                        memcpy(e1, e, sizeof(e1));
                        e1[pos] = v < 4 ? bad[v] : FLT_MAX;
                        if (v == 4)
                            for (int j = 0; j < nsrc; j++)
                                xs[j][pos < count ? pos : 0] = FLT_MAX;
                        lstate_init(&bad_st, N, 0, 0);
                        lstate_restore(&bad_st, e1);
                        if (v < 4 || pos < count) {
                            memcpy(le, bad_st.st.v[0], sizeof(le));
                            lsc = 42.0f;
                            ck_assert_int_eq(lstate_worker(im[k], &bad_st, src,
                                                           nsrc, count, lbits,
                                                           &lsc),
                                             OBD_CODEC_ENONFINITE);
                            ck_assert(lsc == 42.0f);
                            ck_assert(memcmp(le, bad_st.st.v[0], sizeof(le)) ==
                                      0);
                            ck_assert_int_eq(bad_st.st.mode[0],
                                             OBD_CODEC_LAZY_EAGER);
                        }
                        lstate_fini(&bad_st);
                        memcpy(x0, good, sizeof(good));
                        lstate_fini(&ls);
                        continue;
                    }
                    /* A bad source element (v == 4: finite, but the sum
                     * overflows). */
                    if (v < 4) {
                        xs[where][pos] = bad[v];
                    } else {
                        for (int j = 0; j < nsrc; j++)
                            xs[j][pos] = FLT_MAX;
                        ls.st.v[ls.st.cur][pos] =
                            FLT_MAX; /* b = FLT_MAX + ... */
                    }
                    if (v < 4 && where == 1 && nsrc == 1) {
                        /* x1 is not read with one source. */
                        lstate_fini(&ls);
                        continue;
                    }
                    keep = fdup(ls.st.v[ls.st.cur], N);
                    {
                        enum obd_codec_lazy_mode mk = ls.st.mode[ls.st.cur];
                        float sk = ls.st.scale[ls.st.cur];
                        int ck = ls.st.cur;

                        lsc = 42.0f;
                        ck_assert_int_eq(lstate_worker(im[k], &ls, src, nsrc,
                                                       count, lbits, &lsc),
                                         OBD_CODEC_ENONFINITE);
                        ck_assert(lsc == 42.0f);
                        ck_assert_int_eq(ls.st.cur, ck);
                        ck_assert_int_eq(ls.st.mode[ls.st.cur], mk);
                        ck_assert(memcmp(&ls.st.scale[ls.st.cur], &sk, 4) == 0);
                        ck_assert(memcmp(keep, ls.st.v[ls.st.cur], N * 4) == 0);
                        ck_assert_int_eq(obd_codec_lazy_state_abort(&ls.st), 0);
                        ck_assert_int_eq(ls.st.mode[ls.st.cur], mk);
                    }
                    free(keep);
                    if (v == 4) {
                        /* The state was edited by hand above; done. */
                        lstate_fini(&ls);
                        continue;
                    }
                    /* The failed step left no trace: a good step now
                     * equals the eager one. */
                    fill_unit(&r, x0, count, 1.0f);
                    fill_unit(&r, x1, count, 1.0f);
                    if (nsrc == 1)
                        ck_assert_int_eq(obd_codec_compress(im[k], x0, count, e,
                                                            N, bits, &sc),
                                         0);
                    else
                        ck_assert_int_eq(obd_codec_compress_avg(im[k], src, 2,
                                                                count, e, b, N,
                                                                bits, &sc),
                                         0);
                    ck_assert_int_eq(lstate_worker(im[k], &ls, src, nsrc, count,
                                                   lbits, &lsc),
                                     0);
                    ck_assert(memcmp(&lsc, &sc, 4) == 0);
                    ck_assert(memcmp(lbits, bits, sizeof(bits)) == 0);
                    lstate_error(im[k], &ls, le);
                    ck_assert(memcmp(le, e, sizeof(le)) == 0);
                    lstate_fini(&ls);
                }
}
END_TEST

/* The server: a bad participant scale writes nothing at all; a NaN or Inf
 * in a restored error, or an m that overflows, at any position, leaves a
 * double-buffered state untouched. */
START_TEST(lazy_server_nonfinite)
{
    struct rng r = {0x5badu};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const float bad_scales[] = {-1.0f, -FLT_TRUE_MIN, NAN,
                                -NAN,  INFINITY,      -INFINITY};
    const float bad_err[] = {NAN, INFINITY, -INFINITY};
    const size_t chunk = 48;

    for (int k = 0; k < ni; k++)
        for (int n = 1; n <= 5; n++) {
            uint8_t bm[5][6], bits[6];
            const uint8_t *in[5];
            float scales[5], e[48], keep[48], nx[48], sc;
            struct lstate ls;

            for (int j = 0; j < n; j++) {
                fill_bytes(&r, bm[j], chunk / 8);
                in[j] = bm[j];
                scales[j] = 0.25f * (float)(j + 1);
            }
            fill_unit(&r, e, chunk, 0.5f);
            for (size_t b = 0; b < sizeof(bad_scales) / sizeof(float); b++) {
                struct obd_codec_lazy prev = {OBD_CODEC_LAZY_EAGER, 0.0f, e};
                float s0 = scales[b % (size_t)n];

                scales[b % (size_t)n] = bad_scales[b];
                memset(nx, 0x11, sizeof(nx));
                memcpy(keep, nx, sizeof(nx));
                memset(bits, 0x3c, sizeof(bits));
                sc = 42.0f;
                ck_assert_int_eq(obd_codec_lazy_server(im[k], in, scales, n,
                                                       &prev, nx, chunk, bits,
                                                       &sc),
                                 OBD_CODEC_ENONFINITE);
                ck_assert(sc == 42.0f);
                ck_assert(memcmp(nx, keep, sizeof(nx)) == 0);
                for (int q = 0; q < 6; q++)
                    ck_assert_uint_eq(bits[q], 0x3c);
                scales[b % (size_t)n] = s0;
            }
            for (size_t pos = 0; pos < chunk; pos++)
                for (size_t b = 0; b < 4; b++) {
                    float e1[48];

                    lstate_init(&ls, chunk, 0, pos % 2);
                    memcpy(e1, e, sizeof(e1));
                    if (b < 3) {
                        e1[pos] = bad_err[b];
                    } else {
                        /* Finite everywhere, but m overflows: every
                         * participant votes + with scale 3e38 and the
                         * error adds FLT_MAX. */
                        e1[pos] = FLT_MAX;
                        for (int j = 0; j < n; j++) {
                            bm[j][pos / 8] |= (uint8_t)(0x80 >> (pos % 8));
                            scales[j] = 3e38f;
                        }
                    }
                    lstate_restore(&ls, e1);
                    memcpy(keep, ls.st.v[0], sizeof(keep));
                    sc = 42.0f;
                    ck_assert_int_eq(
                        lstate_server(im[k], &ls, in, scales, n, bits, &sc),
                        OBD_CODEC_ENONFINITE);
                    ck_assert(sc == 42.0f);
                    ck_assert_int_eq(ls.st.cur, 0);
                    ck_assert_int_eq(ls.st.mode[0], OBD_CODEC_LAZY_EAGER);
                    ck_assert(memcmp(keep, ls.st.v[0], sizeof(keep)) == 0);
                    lstate_fini(&ls);
                    for (int j = 0; j < n; j++)
                        scales[j] = 0.25f * (float)(j + 1);
                }
        }
}
END_TEST

START_TEST(lazy_invalid)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    float x[16] = {0}, v[16] = {0}, nx[16], sc = 7.0f;
    const float *src[1] = {x};
    uint8_t bits[2] = {0x5a, 0x5a}, b0[2] = {0};
    const uint8_t *in[1] = {b0};
    float scales[1] = {1.0f};
    struct obd_codec_lazy ok = {OBD_CODEC_LAZY_ZERO, 0.0f, NULL};
    const struct obd_codec_lazy bad[] = {
        {OBD_CODEC_LAZY_EAGER, 0.0f, NULL},
        {OBD_CODEC_LAZY_DEFERRED, 1.0f, NULL},
        {OBD_CODEC_LAZY_DEFERRED, -1.0f, v},
        {OBD_CODEC_LAZY_DEFERRED, NAN, v},
        {OBD_CODEC_LAZY_DEFERRED, INFINITY, v},
        {(enum obd_codec_lazy_mode)7, 0.0f, v},
    };

    for (int k = 0; k < ni; k++) {
        memset(nx, 0x11, sizeof(nx));
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 0, 1, &ok, nx, 8, bits, &sc),
            OBD_CODEC_EINVAL);
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 1, 1, &ok, nx, 0, bits, &sc),
            OBD_CODEC_EINVAL);
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 1, 1, &ok, nx, 12, bits, &sc),
            OBD_CODEC_EINVAL);
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 1, 17, &ok, nx, 16, bits, &sc),
            OBD_CODEC_EINVAL);
        ck_assert_int_eq(
            obd_codec_lazy_server(im[k], in, scales, 0, &ok, nx, 8, bits, &sc),
            OBD_CODEC_EINVAL);
        ck_assert_int_eq(
            obd_codec_lazy_server(im[k], in, scales, 1, &ok, nx, 12, bits, &sc),
            OBD_CODEC_EINVAL);
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, 1, 16, &bad[b],
                                                     nx, 16, bits, &sc),
                             OBD_CODEC_EINVAL);
            ck_assert_int_eq(obd_codec_lazy_server(im[k], in, scales, 1,
                                                   &bad[b], nx, 16, bits, &sc),
                             OBD_CODEC_EINVAL);
        }
        ck_assert(sc == 7.0f);
        ck_assert_uint_eq(bits[0], 0x5a);
        ck_assert_uint_eq(bits[1], 0x5a);
        for (size_t i = 0; i < 16; i++) {
            uint32_t u;
            memcpy(&u, &nx[i], sizeof(u));
            ck_assert_uint_eq(u, 0x11111111u);
        }
    }
}
END_TEST

/* The block kernels, portable against AVX2 bit for bit: every mode,
 * nsrc 1..3 and n 1..16, ranges at begin offsets that are multiples of 8
 * (but not of 16 or 32) with the sources ending inside, next in place or
 * apart at every alignment; returned sums compared as doubles, byte for
 * byte. Also lazy_error, in place and apart. */
START_TEST(lazy_portable_equals_avx2)
{
    const struct obd_codec_impl *P = obd_codec_portable();
    const struct obd_codec_impl *V = obd_codec_avx2();
    struct rng r = {0x1d1du};
    const size_t N = 4096 + 64;

    if (V == NULL)
        return;
    for (int iter = 0; iter < 400; iter++) {
        enum obd_codec_lazy_mode mode = (enum obd_codec_lazy_mode)(iter % 3);
        int nsrc = 1 + iter % 3, n = 1 + (iter * 7) % 16;
        size_t begin = 8 * (rng_next(&r) % 200);
        size_t end = begin + 8 * (rng_next(&r) % 300);
        size_t count = rng_next(&r) % (N + 1);
        size_t off = rng_next(&r) % 8;
        int inplace = iter % 4 == 0;
        float *srcm[3], *v = xmalloc(N * sizeof(float));
        float *na = xmalloc((N + 8) * sizeof(float));
        float *nb = xmalloc((N + 8) * sizeof(float));
        float *va = NULL, *vb = NULL;
        const float *src[3];
        uint8_t *bm[16], *ba = xmalloc(N / 8), *bb = xmalloc(N / 8);
        const uint8_t *in[16];
        float scales[16];
        struct obd_codec_lazy pa, pb;
        double sa, sb;

        for (int k = 0; k < nsrc; k++) {
            srcm[k] = xmalloc((count ? count : 1) * sizeof(float));
            fill_mixed(&r, srcm[k], count);
            src[k] = srcm[k];
        }
        for (int k = 0; k < n; k++) {
            bm[k] = xmalloc(N / 8);
            fill_bytes(&r, bm[k], N / 8);
            in[k] = bm[k];
            scales[k] = iter % 5 == 0 ? -0.0f : rng_unit(&r) * 0.5f + 0.5f;
        }
        fill_mixed(&r, v, N);
        pa = (struct obd_codec_lazy){mode, iter % 9 == 0 ? 0.0f : 0.3f, v};
        pb = pa;
        if (inplace) {
            /* Each implementation gets its own copy of the state. */
            va = fdup(v, N);
            vb = fdup(v, N);
            pa.v = va;
            pb.v = vb;
        }
        for (int op = 0; op < 3; op++) {
            float *xa = inplace ? va : na + off, *xb = inplace ? vb : nb + off;

            if (inplace && op > 0) {
                memcpy(va, v, N * sizeof(float));
                memcpy(vb, v, N * sizeof(float));
            }
            memset(ba, 0, N / 8);
            memset(bb, 0, N / 8);
            if (op == 0) {
                sa = P->lazy_worker_block(src, nsrc, count, &pa, xa, begin, end,
                                          ba);
                sb = V->lazy_worker_block(src, nsrc, count, &pb, xb, begin, end,
                                          bb);
            } else if (op == 1) {
                sa = P->lazy_server_block(in, scales, n, &pa, xa, begin, end,
                                          ba);
                sb = V->lazy_server_block(in, scales, n, &pb, xb, begin, end,
                                          bb);
            } else {
                P->lazy_error(&pa, xa, begin, end);
                V->lazy_error(&pb, xb, begin, end);
                sa = sb = 0.0;
            }
            ck_assert_msg(memcmp(&sa, &sb, sizeof(double)) == 0,
                          "iter %d op %d: sums %a vs %a", iter, op, sa, sb);
            ck_assert_msg(memcmp(xa + begin, xb + begin,
                                 (end - begin) * sizeof(float)) == 0,
                          "iter %d op %d: next differs", iter, op);
            ck_assert_msg(memcmp(ba, bb, N / 8) == 0,
                          "iter %d op %d: bits differ", iter, op);
        }
        for (int k = 0; k < n; k++)
            free(bm[k]);
        for (int k = 0; k < nsrc; k++)
            free(srcm[k]);
        free(va);
        free(vb);
        free(bb);
        free(ba);
        free(nb);
        free(na);
        free(v);
    }
}
END_TEST

/* A RESET state (one buffer, in place) whose step fails: abort resets it
 * to ZERO and says so; the next step is exactly the eager step from a
 * zero error. A ROLLBACK state's abort changes nothing. Also an abort
 * after a failure of another node (the step itself succeeded here). */
START_TEST(lazy_state_abort)
{
    struct rng r = {0xab047u};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const size_t count = 1000, N = 1000;

    for (int k = 0; k < ni; k++)
        for (int other = 0; other < 2; other++) {
            float *x = xmalloc(N * sizeof(float)), *e = xmalloc(N * 4);
            float *le = xmalloc(N * sizeof(float)), sc, lsc = 0.0f;
            uint8_t bits[125], lbits[125];
            const float *src[1] = {x};
            struct lstate ls, lr;

            lstate_init(&ls, N, 1, 0);
            lstate_init(&lr, N, 0, 0);
            for (int step = 0; step < 3; step++) {
                fill_unit(&r, x, count, 1.0f);
                ck_assert_int_eq(
                    lstate_worker(im[k], &ls, src, 1, count, lbits, &lsc), 0);
                ck_assert_int_eq(
                    lstate_worker(im[k], &lr, src, 1, count, lbits, &lsc), 0);
            }
            lstate_error(im[k], &lr, e);
            /* The failing step: a NaN here, or (other) a good step here
             * while some other node failed the op. */
            fill_unit(&r, x, count, 1.0f);
            x[count / 2] = other ? x[count / 2] : NAN;
            {
                struct obd_codec_lazy p1 = lstate_prev(&ls),
                                      p2 = lstate_prev(&lr);
                int want = other ? 0 : OBD_CODEC_ENONFINITE;
                ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, 1, count,
                                                         &p1, lstate_next(&ls),
                                                         N, lbits, &lsc),
                                 want);
                ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, 1, count,
                                                         &p2, lstate_next(&lr),
                                                         N, lbits, &lsc),
                                 want);
            }
            ck_assert_int_eq(obd_codec_lazy_state_abort(&ls.st), 1);
            ck_assert_int_eq(ls.st.mode[ls.st.cur], OBD_CODEC_LAZY_ZERO);
            ck_assert_int_eq(obd_codec_lazy_state_abort(&lr.st), 0);
            ck_assert_int_eq(lr.st.mode[lr.st.cur], OBD_CODEC_LAZY_DEFERRED);
            /* Next step: RESET from zero, ROLLBACK from the kept error. */
            fill_unit(&r, x, count, 1.0f);
            for (int t = 0; t < 2; t++) {
                struct lstate *st = t ? &lr : &ls;
                float *ee = xmalloc(N * sizeof(float));

                if (t)
                    memcpy(ee, e, N * sizeof(float));
                else
                    memset(ee, 0, N * sizeof(float));
                ck_assert_int_eq(
                    obd_codec_compress(im[k], x, count, ee, N, bits, &sc), 0);
                ck_assert_int_eq(
                    lstate_worker(im[k], st, src, 1, count, lbits, &lsc), 0);
                ck_assert(memcmp(&sc, &lsc, sizeof(float)) == 0);
                ck_assert(memcmp(bits, lbits, sizeof(bits)) == 0);
                lstate_error(im[k], st, le);
                ck_assert(memcmp(ee, le, N * sizeof(float)) == 0);
                free(ee);
            }
            lstate_fini(&lr);
            lstate_fini(&ls);
            free(le);
            free(e);
            free(x);
        }
}
END_TEST

/* decompress_stream writes exactly what decompress writes, at every
 * alignment of the output (streaming stores of 32 or 16 bytes, or none)
 * and every length, and nothing outside [0, elems). */
START_TEST(decompress_stream_equals_decompress)
{
    struct rng r = {0xd5u};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const size_t lens[] = {0, 1, 7, 8, 9, 63, 1000, 1000003};
    const float scales[] = {0.75f, -0.0f, 0x1p-140f};

    for (int k = 0; k < ni; k++)
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
            for (size_t off = 0; off < 8; off++) {
                size_t n = lens[l];
                uint8_t *bits = xmalloc(n / 8 + 1);
                float *a = xmalloc((n + 16) * sizeof(float));
                float *b = xmalloc((n + 16) * sizeof(float));
                float sc = scales[(l + off) % 3];

                fill_bytes(&r, bits, n / 8 + 1);
                memset(a, 0x5c, (n + 16) * sizeof(float));
                memset(b, 0x5c, (n + 16) * sizeof(float));
                im[k]->decompress(bits, sc, a + off, n);
                im[k]->decompress_stream(bits, sc, b + off, n);
                ck_assert_msg(memcmp(a, b, (n + 16) * sizeof(float)) == 0,
                              "%s: %zu elements at offset %zu", im[k]->name, n,
                              off);
                free(b);
                free(a);
                free(bits);
            }
}
END_TEST

static Suite *codec_suite(void)
{
    Suite *s = suite_create("codec");
    TCase *tc = tcase_create("core");

    /* The 1000003-element cases under ASan take tens of seconds. */
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, padded_len_exact);
    tcase_add_test(tc, scale_combine);
    tcase_add_test(tc, invalid_sizes);
    tcase_add_test(tc, dispatch);
    tcase_add_test(tc, worker_vs_reference);
    tcase_add_test(tc, worker_adversarial);
    tcase_add_test(tc, worker_nonfinite);
    tcase_add_test(tc, server_vs_reference);
    tcase_add_test(tc, server_rejects);
    tcase_add_test(tc, decompress_vs_reference);
    tcase_add_test(tc, portable_equals_avx2);
    tcase_add_test(tc, avg_vs_reference);
    tcase_add_test(tc, avg_one_equals_compress);
    tcase_add_test(tc, avg_nonfinite);
    tcase_add_test(tc, avg_invalid_sizes);
    tcase_add_test(tc, avg_portable_equals_avx2);
    tcase_add_test(tc, worker_conservation);
    tcase_add_test(tc, server_conservation);
    tcase_add_test(tc, full_round_vs_reference);
    tcase_add_test(tc, lazy_worker_equals_eager);
    tcase_add_test(tc, lazy_server_equals_eager);
    tcase_add_test(tc, lazy_worker_nonfinite);
    tcase_add_test(tc, lazy_server_nonfinite);
    tcase_add_test(tc, lazy_invalid);
    tcase_add_test(tc, lazy_state_abort);
    tcase_add_test(tc, lazy_portable_equals_avx2);
    tcase_add_test(tc, decompress_stream_equals_decompress);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return ck_run(codec_suite());
}
