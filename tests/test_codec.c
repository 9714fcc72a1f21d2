/* Tests of the 1-bit codec (daemon/codec.c, daemon/codec_avx2.c).
 *
 * Two references. The naive one below is written from docs/design.md, "The
 * compressed allreduce, exactly", and the exact arithmetic in codec.h,
 * deliberately plainly: one double loop for a norm, one element at a time for
 * everything else. The codec sums squares in a different (lane-structured,
 * blocked) order, so its scales may differ from the naive reference's by
 * rounding; everything that does not depend on the scale (b, m, the signs) must
 * match exactly. The bit-identity reference, tests/codec_ref.h, carries out the
 * same arithmetic in the codec's order, in two passes: every implementation of
 * the codec (portable and AVX2) must match it bit for bit, and it must
 * match the naive reference as the codec does.
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
#include "codec_ref.h"

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

/* Relative tolerance of a scale against the naive reference: both are a
 * float rounding of nearly the same double, so they differ by at most one
 * float ulp (2^-23 relative) in practice; 1e-6 leaves room for the
 * different summation order. */
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

/* Zeros of both signs, denormals, huge values and plain ones. */
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

static size_t naive_padded(size_t count, int n)
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

static int bit_of(const uint8_t *bits, size_t i)
{
    return (bits[i / 8] >> (7 - i % 8)) & 1;
}

static void set_bit(uint8_t *bits, size_t i, int v)
{
    if (v)
        bits[i / 8] |= (uint8_t)(0x80 >> (i % 8));
    else
        bits[i / 8] &= (uint8_t) ~(0x80 >> (i % 8));
}

/* Steps 2-3 for one worker over the exact average of nsrc local buffers,
 * as codec.h spells it: a = src_0 + src_1 + ... in order, a / (float)nsrc,
 * b = a + e. b_out (N floats) receives b. Returns -1 (writing nothing) on
 * non-finite b. */
static int naive_worker(const float *const *src, int nsrc, size_t count,
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
        set_bit(bits, i, s > 0.0f);
    }
    *scale = sc;
    memcpy(b_out, b, N * sizeof(float));
    free(b);
    return 0;
}

/* Step 4 for one server; m is also returned for the sign-ambiguity test. */
static int naive_server(const uint8_t *const *in, const float *scales, int n,
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
            a += (bit_of(in[k], i) ? 1.0f : -1.0f) * scales[k];
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
        set_bit(bits, i, t > 0.0f);
        if (m_out)
            m_out[i] = m[i];
    }
    *sscale = sc;
    free(m);
    return 0;
}

static void naive_decompress(const uint8_t *bits, float scale, float *out,
                             size_t elems)
{
    for (size_t i = 0; i < elems; i++)
        out[i] = bit_of(bits, i) ? scale : -scale;
}

/* ---- Comparison helpers ---------------------------------------------- */

static void assert_scale_close(float got, float want)
{
    double d = fabs((double)got - (double)want);
    ck_assert_msg(d <= SCALE_RTOL * fabs((double)want), "scale %a vs ref %a",
                  (double)got, (double)want);
}

/* An error element computed as b -+ scale against the naive reference's
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

static void expect_same_floats(const float *a, const float *b, size_t n,
                               const char *what, int step)
{
    for (size_t i = 0; i < n; i++)
        EXPECT(memcmp(&a[i], &b[i], sizeof(float)) == 0,
               "step %d: %s[%zu] = %a, reference %a", step, what, i,
               (double)a[i], (double)b[i]);
}

/* ---- Lazy states ------------------------------------------------------ */

/* A lazy state for the tests, over buffers this owns. In place it is
 * the daemon's: one obd_codec_lazy_state, whose steps rewrite its buffer.
 * With two buffers it drives the kernels' other mode, next apart from
 * prev: two obd_codec_lazy_states used in turn, a step reading st[cur]
 * and writing (then committing) st[1 - cur], so that a failed step leaves
 * st[cur] as it was. `off` shifts both buffers by that many floats inside
 * their allocations, so the kernels meet every alignment (and hence every
 * kind of store). */
struct lstate {
    float *mem[2];
    struct obd_codec_lazy_state st[2];
    int two, cur;
    size_t n;
};

static void lstate_init(struct lstate *s, size_t n, int inplace, size_t off)
{
    for (int k = 0; k < 2; k++) {
        s->mem[k] = xmalloc((n + 8) * sizeof(float));
        memset(s->mem[k], 0x7f, (n + 8) * sizeof(float)); /* NaN-free junk */
        obd_codec_lazy_state_init(&s->st[k], s->mem[k] + off);
    }
    s->two = !inplace;
    s->cur = 0;
    s->n = n;
}

static void lstate_fini(struct lstate *s)
{
    free(s->mem[0]);
    free(s->mem[1]);
}

/* The state a step reads. */
static struct obd_codec_lazy_state *lstate_cur(struct lstate *s)
{
    return &s->st[s->cur];
}

static void lstate_restore(struct lstate *s, const float *e)
{
    obd_codec_lazy_state_restore(lstate_cur(s), e, s->n);
}

static struct obd_codec_lazy lstate_prev(const struct lstate *s)
{
    return obd_codec_lazy_state_prev(&s->st[s->cur]);
}

static float *lstate_next(struct lstate *s)
{
    return obd_codec_lazy_state_next(&s->st[s->two ? 1 - s->cur : s->cur]);
}

static void lstate_commit(struct lstate *s, float scale)
{
    if (s->two)
        s->cur = 1 - s->cur;
    obd_codec_lazy_state_commit(lstate_cur(s), scale);
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

/* ---- One step on every implementation --------------------------------- */

/* The worker step over nsrc sources from the error e0, on the bit-identity
 * reference (codec_ref_compress_avg) and, as the daemon takes it, on
 * every implementation: a state restored from e0 (mode EAGER) and stepped
 * in place. Each implementation must equal the reference byte for byte:
 * bits, scale, the state (the reference's b) and the state's error (the
 * reference's new e). The reference's results are left in bits, *scale,
 * e and b. */
static void worker_all(const float *const *src, int nsrc, size_t count,
                       const float *e0, size_t N, uint8_t *bits, float *scale,
                       float *e, float *b)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    uint8_t *lbits = xmalloc(N / 8);
    float *le = xmalloc(N * sizeof(float));

    memcpy(e, e0, N * sizeof(float));
    ck_assert_int_eq(
        codec_ref_compress_avg(src, nsrc, count, e, b, N, bits, scale), 0);
    for (int k = 0; k < ni; k++) {
        struct lstate ls;
        float lsc = -1.0f;

        lstate_init(&ls, N, 1, 0);
        lstate_restore(&ls, e0);
        memset(lbits, 0xa5, N / 8);
        ck_assert_int_eq(
            lstate_worker(im[k], &ls, src, nsrc, count, lbits, &lsc), 0);
        ck_assert_msg(memcmp(&lsc, scale, sizeof(float)) == 0,
                      "%s: scale %a, reference %a", im[k]->name, (double)lsc,
                      (double)*scale);
        ck_assert_msg(memcmp(lbits, bits, N / 8) == 0, "%s: bits", im[k]->name);
        expect_same_floats(lstate_cur(&ls)->v, b, N, im[k]->name, 0);
        lstate_error(im[k], &ls, le);
        expect_same_floats(le, e, N, im[k]->name, 0);
        lstate_fini(&ls);
    }
    free(le);
    free(lbits);
}

/* The server step from the chunk error err0, on the reference
 * (codec_ref_server) and on every implementation as the daemon takes it,
 * which must equal the reference byte for byte (bits, scale, error). The
 * reference's results are left in bits, *sscale and err. */
static void server_all(const uint8_t *const *in, const float *scales, int n,
                       const float *err0, size_t chunk, uint8_t *bits,
                       float *sscale, float *err)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    uint8_t *lbits = xmalloc(chunk / 8);
    float *le = xmalloc(chunk * sizeof(float));

    memcpy(err, err0, chunk * sizeof(float));
    ck_assert_int_eq(codec_ref_server(in, scales, n, err, chunk, bits, sscale),
                     0);
    for (int k = 0; k < ni; k++) {
        struct lstate ls;
        float lsc = -1.0f;

        lstate_init(&ls, chunk, 1, 0);
        lstate_restore(&ls, err0);
        memset(lbits, 0xa5, chunk / 8);
        ck_assert_int_eq(lstate_server(im[k], &ls, in, scales, n, lbits, &lsc),
                         0);
        ck_assert_msg(memcmp(&lsc, sscale, sizeof(float)) == 0,
                      "%s: sscale %a, reference %a", im[k]->name, (double)lsc,
                      (double)*sscale);
        ck_assert_msg(memcmp(lbits, bits, chunk / 8) == 0, "%s: server bits",
                      im[k]->name);
        lstate_error(im[k], &ls, le);
        expect_same_floats(le, err, chunk, im[k]->name, 0);
        lstate_fini(&ls);
    }
    free(le);
    free(lbits);
}

/* ---- Padded length and scale ------------------------------------------ */

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
            ck_assert_uint_eq(got, naive_padded(counts[c], world_sizes[s]));
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

START_TEST(scale_combine)
{
    double sums[3] = {1.0, 2.0, 6.0}, bad[2] = {1.0, INFINITY};
    float sc = -1.0f;

    ck_assert_int_eq(obd_codec_scale(sums, 3, 9, &sc), 0);
    ck_assert(sc == 1.0f);
    ck_assert_int_eq(obd_codec_scale(bad, 2, 9, &sc), OBD_E_NONFINITE);
    ck_assert(sc == 1.0f);
    bad[1] = NAN;
    ck_assert_int_eq(obd_codec_scale(bad, 2, 9, &sc), OBD_E_NONFINITE);
    ck_assert(sc == 1.0f);
    ck_assert_int_eq(obd_codec_scale(sums, 1, 0, &sc), OBD_E_INVAL);
    ck_assert(sc == 1.0f);
}
END_TEST

/* ---- Worker step against the references ------------------------------- */

/* The worker step over nsrc sources from the error e0 on every
 * implementation and the bit-identity reference (worker_all), then
 * against the naive reference: bits and b exactly, the scale to
 * SCALE_RTOL and the error to the bound of assert_err_close. */
static void check_worker(const float *const *src, int nsrc, size_t count,
                         const float *e0, size_t N)
{
    size_t nb = N / 8;
    uint8_t *nbits = xmalloc(nb), *bits = xmalloc(nb);
    float *ne = fdup(e0, N), *nbv = xmalloc(N * sizeof(float));
    float *e = xmalloc(N * sizeof(float)), *b = xmalloc(N * sizeof(float));
    float nscale, scale;

    memset(nbits, 0, nb);
    ck_assert_int_eq(naive_worker(src, nsrc, count, ne, N, nbits, &nscale, nbv),
                     0);
    worker_all(src, nsrc, count, e0, N, bits, &scale, e, b);
    ck_assert_msg(memcmp(bits, nbits, nb) == 0, "bits");
    ck_assert_msg(memcmp(b, nbv, N * sizeof(float)) == 0, "b");
    assert_scale_close(scale, nscale);
    assert_err_close(e, ne, N, scale, nscale);
    free(b);
    free(e);
    free(nbv);
    free(ne);
    free(bits);
    free(nbits);
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
            const float *src[1] = {x};

            fill_unit(&r, x, count, 3.0f);
            fill_unit(&r, e, N, 0.5f);
            check_worker(src, 1, count, e, N);
            /* Fresh state: the error starts at zero. */
            memset(e, 0, N * sizeof(float));
            check_worker(src, 1, count, e, N);
            free(e);
            free(x);
        }
}
END_TEST

/* Adversarial finite inputs, checked against the references like above. */
START_TEST(worker_adversarial)
{
    struct rng r = {99};
    const size_t count = 1003, N = obd_codec_padded_len(count, 3);
    float *x = xmalloc(count * sizeof(float));
    float *e = xmalloc(N * sizeof(float));
    float *e1 = xmalloc(N * sizeof(float)), *b = xmalloc(N * sizeof(float));
    uint8_t *bits = xmalloc(N / 8);
    const float *src[1] = {x};
    float sc;

    /* All zeros: scale 0, every sign +1 (bit 1), error stays 0. */
    memset(x, 0, count * sizeof(float));
    memset(e, 0, N * sizeof(float));
    check_worker(src, 1, count, e, N);
    sc = -1.0f;
    worker_all(src, 1, count, e, N, bits, &sc, e1, b);
    ck_assert(sc == 0.0f);
    for (size_t i = 0; i < N / 8; i++)
        EXPECT(bits[i] == 0xff, "bits[%zu]", i);
    for (size_t i = 0; i < N; i++)
        EXPECT(e1[i] == 0.0f, "e[%zu]", i);

    /* -0.0 in both x and e gives b = -0.0, which counts as +1. */
    for (size_t i = 0; i < count; i++)
        x[i] = -0.0f;
    for (size_t i = 0; i < N; i++)
        e[i] = -0.0f;
    check_worker(src, 1, count, e, N);
    worker_all(src, 1, count, e, N, bits, &sc, e1, b);
    for (size_t i = 0; i < N / 8; i++)
        EXPECT(bits[i] == 0xff, "bits[%zu]", i);

    /* Denormals of both signs, with a zero error and a denormal error. */
    for (size_t i = 0; i < count; i++)
        x[i] = rng_unit(&r) * 0x1p-130f;
    memset(e, 0, N * sizeof(float));
    check_worker(src, 1, count, e, N);
    for (size_t i = 0; i < N; i++)
        e[i] = rng_unit(&r) * 0x1p-140f;
    check_worker(src, 1, count, e, N);

    /* Huge but finite values: squares stay finite in double. */
    for (size_t i = 0; i < count; i++)
        x[i] = (rng_next(&r) & 1) ? 3e38f : -3e38f;
    memset(e, 0, N * sizeof(float));
    check_worker(src, 1, count, e, N);
    x[5] = FLT_MAX;
    x[6] = -FLT_MAX;
    check_worker(src, 1, count, e, N);

    /* A mix spanning the whole exponent range. */
    for (size_t i = 0; i < count; i++)
        x[i] = ldexpf(rng_unit(&r), (int)(rng_next(&r) % 250) - 140);
    fill_unit(&r, e, N, 1e-3f);
    check_worker(src, 1, count, e, N);

    free(bits);
    free(b);
    free(e1);
    free(e);
    free(x);
}
END_TEST

/* The worker step must fail with ENONFINITE on every implementation and
 * leave *scale untouched, and the state it read stays exactly as it was
 * when next is apart from it; stepped in place (the daemon's way) it
 * fails alike. Both references reject the input too. */
static void expect_worker_rejects(const float *const *src, int nsrc,
                                  size_t count, const float *e0, size_t N)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    uint8_t *bits = xmalloc(N / 8);
    float *e = fdup(e0, N), *b = xmalloc(N * sizeof(float));
    float *next = xmalloc(N * sizeof(float)), sc;

    ck_assert_int_eq(naive_worker(src, nsrc, count, e, N, bits, &sc, b), -1);
    ck_assert_int_eq(
        codec_ref_compress_avg(src, nsrc, count, e, b, N, bits, &sc),
        OBD_E_NONFINITE);
    for (int k = 0; k < ni; k++) {
        struct obd_codec_lazy prev = {OBD_CODEC_LAZY_EAGER, 0.0f, e};
        float sc0 = 1234.5f;

        memcpy(e, e0, N * sizeof(float));
        sc = sc0;
        ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, nsrc, count, &prev,
                                                 next, N, bits, &sc),
                         OBD_E_NONFINITE);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
        ck_assert(memcmp(e, e0, N * sizeof(float)) == 0);
        ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, nsrc, count, &prev,
                                                 e, N, bits, &sc),
                         OBD_E_NONFINITE);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
    }
    free(next);
    free(b);
    free(e);
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
        const float *src[1] = {x};
        size_t xpos[] = {0, count / 2, count - 1};
        size_t epos[] = {0, count - 1, count, N - 1};

        fill_unit(&r, x, count, 1.0f);
        fill_unit(&r, e, N, 0.1f);
        for (size_t b = 0; b < 4; b++) {
            for (size_t p = 0; p < 3; p++) {
                float keep = x[xpos[p]];
                x[xpos[p]] = bad[b];
                expect_worker_rejects(src, 1, count, e, N);
                x[xpos[p]] = keep;
            }
            /* In the error buffer, including the padding tail past count
             * where x reads as zero. */
            for (size_t p = 0; p < 4; p++) {
                float keep = e[epos[p]];
                e[epos[p]] = bad[b];
                expect_worker_rejects(src, 1, count, e, N);
                e[epos[p]] = keep;
            }
        }
        /* Finite x and e whose sum overflows to +-Inf. */
        {
            size_t p = count - 1;
            float kx = x[p], ke = e[p];
            x[p] = 3e38f;
            e[p] = 3e38f;
            expect_worker_rejects(src, 1, count, e, N);
            x[p] = -3e38f;
            e[p] = -3e38f;
            expect_worker_rejects(src, 1, count, e, N);
            x[p] = kx;
            e[p] = ke;
        }
        free(e);
        free(x);
    }
}
END_TEST

/* ---- Server step against the references ------------------------------- */

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

/* The server step on every implementation and the bit-identity reference
 * (server_all), then against the naive reference: bits exactly, the scale
 * to SCALE_RTOL and the error to the bound of assert_err_close. */
static void check_server(const struct server_in *s)
{
    size_t nb = s->chunk / 8;
    uint8_t *nbits = xmalloc(nb), *bits = xmalloc(nb);
    float *nerr = fdup(s->err, s->chunk), nsc;
    float *err = xmalloc(s->chunk * sizeof(float)), sc;

    memset(nbits, 0, nb);
    ck_assert_int_eq(
        naive_server(s->in, s->scales, s->n, nerr, s->chunk, nbits, &nsc, NULL),
        0);
    server_all(s->in, s->scales, s->n, s->err, s->chunk, bits, &sc, err);
    ck_assert_msg(memcmp(bits, nbits, nb) == 0, "server bits");
    assert_scale_close(sc, nsc);
    assert_err_close(err, nerr, s->chunk, sc, nsc);
    free(err);
    free(nerr);
    free(bits);
    free(nbits);
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

/* The server step must fail with ENONFINITE on every implementation and
 * leave *sscale untouched, and the state it read exactly as it was when
 * next is apart from it. A bad participant scale is refused before
 * anything is written: then bits and next stay untouched too, also in
 * place. Both references reject the input too. */
static void expect_server_rejects(const struct server_in *s, int bad_scale)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    size_t nb = s->chunk / 8, fb = s->chunk * sizeof(float);
    uint8_t *bits = xmalloc(nb), *bits0 = xmalloc(nb);
    float *err = fdup(s->err, s->chunk), *next = xmalloc(fb);
    float *next0 = xmalloc(fb), sc;

    ck_assert_int_eq(
        naive_server(s->in, s->scales, s->n, err, s->chunk, bits, &sc, NULL),
        -1);
    ck_assert_int_eq(
        codec_ref_server(s->in, s->scales, s->n, err, s->chunk, bits, &sc),
        OBD_E_NONFINITE);
    memset(bits0, 0x3c, nb);
    memset(next0, 0x11, fb);
    for (int k = 0; k < ni; k++) {
        struct obd_codec_lazy prev = {OBD_CODEC_LAZY_EAGER, 0.0f, err};
        float sc0 = 42.0f;

        memcpy(err, s->err, fb);
        memcpy(next, next0, fb);
        memcpy(bits, bits0, nb);
        sc = sc0;
        ck_assert_int_eq(obd_codec_lazy_server(im[k], s->in, s->scales, s->n,
                                               &prev, next, s->chunk, bits,
                                               &sc),
                         OBD_E_NONFINITE);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
        ck_assert(memcmp(err, s->err, fb) == 0);
        if (bad_scale) {
            ck_assert(memcmp(next, next0, fb) == 0);
            ck_assert(memcmp(bits, bits0, nb) == 0);
        }
        memcpy(bits, bits0, nb);
        ck_assert_int_eq(obd_codec_lazy_server(im[k], s->in, s->scales, s->n,
                                               &prev, err, s->chunk, bits, &sc),
                         OBD_E_NONFINITE);
        ck_assert(memcmp(&sc, &sc0, sizeof(float)) == 0);
        if (bad_scale) {
            ck_assert(memcmp(err, s->err, fb) == 0);
            ck_assert(memcmp(bits, bits0, nb) == 0);
        }
    }
    free(next0);
    free(next);
    free(err);
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
            expect_server_rejects(&s, 1);
            s.scales[k] = keep;
        }
        for (size_t b = 0; b < sizeof(bad_err) / sizeof(float); b++) {
            size_t pos[] = {0, chunk / 2 + 1, chunk - 1};
            for (size_t p = 0; p < 3; p++) {
                float keep = s.err[pos[p]];
                s.err[pos[p]] = bad_err[b];
                expect_server_rejects(&s, 0);
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
            expect_server_rejects(&s, 0);
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
            naive_decompress(bits, scales[v], ref, elems);
            for (int k = 0; k < ni; k++) {
                memset(out, 0xee, elems * sizeof(float));
                im[k]->decompress(bits, scales[v], out, elems);
                ck_assert(memcmp(out, ref, elems * sizeof(float)) == 0);
            }
            free(ref);
            free(base);
            free(bits);
        }
}
END_TEST

/* ---- Worker step over an average of local buffers --------------------- */

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
                check_worker(a.src, nsrc, count, e, N);
                /* Fresh state: the error starts at zero. */
                memset(e, 0, N * sizeof(float));
                check_worker(a.src, nsrc, count, e, N);
                avg_in_fini(&a);
                free(e);
            }
}
END_TEST

/* The reference's two worker forms are one arithmetic with one source, as
 * codec.h promises of the worker: the tests hold the lazy steps with one
 * source to codec_ref_compress and with several to
 * codec_ref_compress_avg. Byte for byte, block sums included. */
START_TEST(avg_one_equals_compress)
{
    struct rng r = {0xb0b};

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
                    double d1 = codec_ref_sumsq_block(x, count, e0, j, end);
                    double d2 =
                        codec_ref_avg_sumsq_block(src, 1, count, e0, j, end, b);
                    ck_assert(memcmp(&d1, &d2, sizeof(double)) == 0);
                }
                ck_assert_int_eq(codec_ref_compress(x, count, e1, N, b1, &s1),
                                 0);
                ck_assert_int_eq(
                    codec_ref_compress_avg(src, 1, count, e2, b, N, b2, &s2),
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
                        expect_worker_rejects(a.src, nsrc, count, e, N);
                        x[xpos[p]] = keep;
                    }
                /* In e, including the padding tail past count. */
                for (size_t p = 0; p < 4; p++) {
                    float keep = e[epos[p]];
                    e[epos[p]] = bad[v];
                    expect_worker_rejects(a.src, nsrc, count, e, N);
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
                    expect_worker_rejects(a.src, nsrc, count, e, N);
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

/* ---- Every implementation against the bit-identity reference ---------- */

/* Whole steps over all sizes, one to MAX_NSRC sources at odd addresses,
 * random and mixed inputs (zeros of both signs, denormals, huge values):
 * every implementation's lazy step equals the reference byte for byte
 * (worker_all). With one source, the server step follows on n chunks of
 * the worker's bits (server_all). */
START_TEST(tensors_equal_reference)
{
    static const int few[] = {1, 3, 8};
    struct rng r = {0xabcdefu};

    for (int nsrc = 1; nsrc <= MAX_NSRC; nsrc++)
        for (size_t c = 0; c < NCOUNTS; c++)
            for (size_t z = 0; z < (nsrc == 1 ? NSIZES : 3); z++)
                for (int mixed = 0; mixed < 2; mixed++) {
                    int n = nsrc == 1 ? world_sizes[z] : few[z];
                    size_t count = counts[c];
                    size_t N = obd_codec_padded_len(count, n);
                    float *e0 = xmalloc(N * sizeof(float));
                    float *e = xmalloc(N * sizeof(float));
                    float *b = xmalloc(N * sizeof(float)), sc;
                    uint8_t *bits = xmalloc(N / 8);
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
                    worker_all(a.src, nsrc, count, e0, N, bits, &sc, e, b);
                    if (nsrc == 1) {
                        size_t chunk = N / (size_t)n;
                        const uint8_t *in[16];
                        float scales[16], *err = xmalloc(chunk * sizeof(float));
                        float ssc;
                        uint8_t *sbits = xmalloc(chunk / 8);

                        for (int k = 0; k < n; k++) {
                            in[k] = bits + (size_t)k * chunk / 8;
                            scales[k] = sc * (float)(k + 1) * 0.37f;
                        }
                        server_all(in, scales, n, e, chunk, sbits, &ssc, err);
                        free(sbits);
                        free(err);
                    }
                    avg_in_fini(&a);
                    free(bits);
                    free(b);
                    free(e);
                    free(e0);
                }
}
END_TEST

/* The block kernels against the reference's passes at begin offsets that
 * are multiples of 8 but not of 16 or 32, spans of whole bytes and the
 * sources ending inside the range, from an EAGER state with next apart
 * from it. Byte for byte: the sums (as doubles), the bits, next (the
 * reference's b, worker only) and, over the range, the error of the
 * state {DEFERRED, scale, next} (the reference's pass 2 with that scale);
 * nothing outside the range of next is written. */
START_TEST(ranges_equal_reference)
{
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    struct rng r = {0xfaceu};
    const size_t len = 3000;
    const size_t begins[] = {0, 8, 24, 40, 1000};
    const size_t spans[] = {8, 16, 24, 32, 40, 104, 1000};
    const size_t xcounts[] = {0, 1, 9, 1017, 1500, len};
    float *e = xmalloc((len + 1) * sizeof(float));
    float *b0 = xmalloc(len * sizeof(float));
    float *rb = xmalloc(len * sizeof(float)),
          *lb = xmalloc(len * sizeof(float));
    float *re = xmalloc(len * sizeof(float)),
          *le = xmalloc(len * sizeof(float));
    uint8_t *bits = xmalloc(len / 8 + 1), rbits[200], lbits[200];
    const struct obd_codec_lazy prev = {OBD_CODEC_LAZY_EAGER, 0.0f, e + 1};
    struct avg_in a;

    avg_in_init(&a, MAX_NSRC, len);
    for (int k = 0; k < MAX_NSRC; k++)
        fill_mixed(&r, a.base[k] + 1, len);
    fill_mixed(&r, e + 1, len);
    fill_mixed(&r, b0, len);
    fill_bytes(&r, bits, len / 8 + 1);
    for (int k = 0; k < ni; k++)
        for (int nsrc = 1; nsrc <= MAX_NSRC; nsrc++)
            for (size_t bg = 0; bg < 5; bg++)
                for (size_t s = 0; s < sizeof(spans) / sizeof(spans[0]); s++)
                    for (size_t xc = 0; xc < 6; xc++) {
                        size_t beg = begins[bg], end = beg + spans[s];
                        size_t cnt = xcounts[xc], fb = spans[s] * 4;
                        struct obd_codec_lazy st;
                        double dr, dl;

                        memcpy(rb, b0, len * sizeof(float));
                        memcpy(re, e + 1, len * sizeof(float));
                        dr = codec_ref_avg_sumsq_block(a.src, nsrc, cnt, e + 1,
                                                       beg, end, rb);
                        codec_ref_sign_range(rb, re, beg, end, 0.3f, rbits);
                        memcpy(lb, b0, len * sizeof(float));
                        dl = im[k]->lazy_worker_block(a.src, nsrc, cnt, &prev,
                                                      lb, beg, end, lbits);
                        ck_assert_msg(memcmp(&dl, &dr, sizeof(double)) == 0,
                                      "%s: sum %a, reference %a", im[k]->name,
                                      dl, dr);
                        ck_assert(memcmp(lb, rb, len * sizeof(float)) == 0);
                        ck_assert(memcmp(lbits, rbits, spans[s] / 8) == 0);
                        st = (struct obd_codec_lazy){OBD_CODEC_LAZY_DEFERRED,
                                                     0.3f, lb};
                        im[k]->lazy_error(&st, le, beg, end);
                        ck_assert(memcmp(le + beg, re + beg, fb) == 0);
                        if (nsrc > 1 || xc > 0)
                            continue;
                        for (int n = 1; n <= 3; n++) {
                            const uint8_t *in[3] = {bits, bits + 7, bits + 100};
                            float sc[3] = {0.5f, 1.25f, 0.0f};

                            memcpy(re, e + 1, len * sizeof(float));
                            dr = codec_ref_server_sumsq_block(in, sc, n, e + 1,
                                                              beg, end);
                            codec_ref_server_range(in, sc, n, re, beg, end,
                                                   0.7f, rbits);
                            memcpy(lb, b0, len * sizeof(float));
                            dl = im[k]->lazy_server_block(in, sc, n, &prev, lb,
                                                          beg, end, lbits);
                            ck_assert(memcmp(&dl, &dr, sizeof(double)) == 0);
                            ck_assert(memcmp(lbits, rbits, spans[s] / 8) == 0);
                            ck_assert(memcmp(lb, b0, beg * sizeof(float)) == 0);
                            ck_assert(memcmp(lb + end, b0 + end,
                                             (len - end) * sizeof(float)) == 0);
                            st = (struct obd_codec_lazy){
                                OBD_CODEC_LAZY_DEFERRED, 0.7f, lb};
                            im[k]->lazy_error(&st, le, beg, end);
                            ck_assert(memcmp(le + beg, re + beg, fb) == 0);
                        }
                    }
    avg_in_fini(&a);
    free(bits);
    free(le);
    free(re);
    free(lb);
    free(rb);
    free(b0);
    free(e);
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

/* Steps in place, as the daemon takes them. One rounding of a sum of two
 * floats and one of b -+ scale separate x + e_old from scale * s + e_new,
 * each at most half an ulp of its result, so
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
            const float *src[1] = {x};
            struct lstate ls;

            lstate_init(&ls, N, 1, 0);
            for (int step = 0; step < 50; step++) {
                float sc;
                fill_unit(&r, x, count, 1.0f + (float)step);
                lstate_error(im[k], &ls, eold);
                ck_assert_int_eq(
                    lstate_worker(im[k], &ls, src, 1, count, bits, &sc), 0);
                lstate_error(im[k], &ls, e);
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
            lstate_fini(&ls);
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
            struct lstate ls;
            float *eold = xmalloc(chunk * sizeof(float));
            uint8_t *bits = xmalloc(chunk / 8);

            server_in_init(&s, &r, n, chunk);
            lstate_init(&ls, chunk, 1, 0);
            for (int step = 0; step < 50; step++) {
                float sc;
                double A = 0.0;
                for (int q = 0; q < n; q++) {
                    fill_bytes(&r, s.bits[q], chunk / 8);
                    s.scales[q] = (float)(0.1 + (rng_next(&r) >> 11) * 0x1p-53);
                    A += s.scales[q];
                }
                lstate_error(im[k], &ls, eold);
                ck_assert_int_eq(
                    lstate_server(im[k], &ls, s.in, s.scales, n, bits, &sc), 0);
                lstate_error(im[k], &ls, s.err);
                for (size_t i = 0; i < chunk; i++) {
                    double avg = 0.0;
                    for (int q = 0; q < n; q++)
                        avg +=
                            (bit_of(s.in[q], i) ? 1 : -1) * (double)s.scales[q];
                    avg /= n;
                    double lhs = avg + (double)eold[i];
                    double t = bit_of(bits, i) ? 1 : -1;
                    double rhs = (double)sc * t + (double)s.err[i];
                    double tol = n * FLT_EPSILON *
                                     (A + fabs(lhs) + fabs((double)s.err[i])) +
                                 FLT_TRUE_MIN;
                    EXPECT(fabs(lhs - rhs) <= tol,
                           "n %d step %d elem %zu: %a vs %a", n, step, i, lhs,
                           rhs);
                }
            }
            lstate_fini(&ls);
            free(bits);
            free(eold);
            server_in_fini(&s);
        }
}
END_TEST

/* ---- A whole multi-participant round against the naive reference ------ */

/* n workers with their own x and error state run steps 1-5 through the
 * codec (lazy steps in place, n server steps, decompress into every
 * participant's output) and through the naive reference, from the same
 * state. Output elements must equal the reference's +-sscale_r to
 * SCALE_RTOL. The one allowed difference is a server sign where the
 * reference's m_i is so close to zero that the worker scales' rounding
 * (SCALE_RTOL each) could flip it:
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
                float *x[16], mult[16];
                struct lstate wl[16], sl[16];
                uint8_t *wb[16], *sb[16], *rwb = xmalloc(N / 8);
                uint8_t *rsb = xmalloc(chunk / 8);
                float *out = xmalloc(N * sizeof(float));
                float *rout = xmalloc(N * sizeof(float));
                float *e = xmalloc(N * sizeof(float));
                float *rwe = xmalloc(N * sizeof(float));
                float *rb = xmalloc(N * sizeof(float));
                float *rse = xmalloc(chunk * sizeof(float));
                float *rm = xmalloc(chunk * sizeof(float));
                size_t ambiguous = 0;

                for (int q = 0; q < n; q++) {
                    x[q] = xmalloc(count * sizeof(float));
                    lstate_init(&wl[q], N, 1, 0);
                    lstate_init(&sl[q], chunk, 1, 0);
                    wb[q] = xmalloc(N / 8);
                    sb[q] = xmalloc(chunk / 8);
                    mult[q] = 0.5f + (float)(rng_next(&r) >> 40) * 0x1p-24f;
                }
                for (int round = 0; round < rounds; round++) {
                    float ws[16], rws[16], ss[16], rss;

                    for (int q = 0; q < n; q++)
                        fill_unit(&r, x[q], count, mult[q]);
                    /* Steps 1-3 on every worker, codec and reference. */
                    for (int q = 0; q < n; q++) {
                        const float *src[1] = {x[q]};

                        lstate_error(im[k], &wl[q], rwe);
                        ck_assert_int_eq(naive_worker(src, 1, count, rwe, N,
                                                      rwb, &rws[q], rb),
                                         0);
                        ck_assert_int_eq(lstate_worker(im[k], &wl[q], src, 1,
                                                       count, wb[q], &ws[q]),
                                         0);
                        ck_assert(memcmp(rwb, wb[q], N / 8) == 0);
                        assert_scale_close(ws[q], rws[q]);
                        lstate_error(im[k], &wl[q], e);
                        assert_err_close(e, rwe, N, ws[q], rws[q]);
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
                        lstate_error(im[k], &sl[s], rse);
                        ck_assert_int_eq(
                            naive_server(in, rws, n, rse, chunk, rsb, &rss, rm),
                            0);
                        ck_assert_int_eq(lstate_server(im[k], &sl[s], in, ws, n,
                                                       sb[s], &ss[s]),
                                         0);
                        assert_scale_close(ss[s], rss);
                        lstate_error(im[k], &sl[s], e);
                        im[k]->decompress(sb[s], ss[s], out + off, chunk);
                        naive_decompress(rsb, rss, rout + off, chunk);
                        float maxs = 0.0f;
                        for (int q = 0; q < n; q++)
                            maxs = fmaxf(maxs, rws[q]);
                        for (size_t i = 0; i < chunk; i++) {
                            if (bit_of(sb[s], i) == bit_of(rsb, i))
                                continue;
                            double lim =
                                4 * SCALE_RTOL * (maxs + fabs((double)e[i]));
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
                    lstate_fini(&sl[q]);
                    lstate_fini(&wl[q]);
                    free(x[q]);
                }
                free(rm);
                free(rse);
                free(rb);
                free(rwe);
                free(e);
                free(rout);
                free(out);
                free(rsb);
                free(rwb);
            }
}
END_TEST

/* ---- Lazy steps against the reference, step after step ----------------- */

/* Three lazy states (double-buffered aligned, double-buffered at odd
 * offsets, in place) against the reference over `steps` steps of
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
            ck_assert_int_eq(codec_ref_compress(src[0], count, e, N, bits, &sc),
                             0);
        else
            ck_assert_int_eq(
                codec_ref_compress_avg(src, nsrc, count, e, b, N, bits, &sc),
                0);
        if (step == steps / 2) {
            /* Snapshot and restore: the error goes out and comes back in
             * the reference's format, exactly. */
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
                          "%s step %d state %d: scale %a, reference %a",
                          im->name, step, t, (double)lsc, (double)sc);
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

START_TEST(lazy_worker_equals_reference)
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
        ck_assert_int_eq(codec_ref_server(in, scales, n, err, chunk, bits, &sc),
                         0);
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
                          "%s n=%d step %d state %d: sscale %a, reference %a",
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

START_TEST(lazy_server_equals_reference)
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
 * returns OBD_E_NONFINITE, *scale is untouched and a double-buffered
 * state is untouched, so the next step (with good data) is exactly the
 * reference's step that never saw the bad one. Also b overflowing from finite
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
                        ck_assert_int_eq(
                            codec_ref_compress(x0, count, e, N, bits, &sc), 0);
                    else
                        ck_assert_int_eq(codec_ref_compress_avg(
                                             src, 2, count, e, b, N, bits, &sc),
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
                            memcpy(le, lstate_cur(&bad_st)->v, sizeof(le));
                            lsc = 42.0f;
                            ck_assert_int_eq(lstate_worker(im[k], &bad_st, src,
                                                           nsrc, count, lbits,
                                                           &lsc),
                                             OBD_E_NONFINITE);
                            ck_assert(lsc == 42.0f);
                            ck_assert(memcmp(le, lstate_cur(&bad_st)->v,
                                             sizeof(le)) == 0);
                            ck_assert_int_eq(lstate_cur(&bad_st)->mode,
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
                        lstate_cur(&ls)->v[pos] = FLT_MAX; /* b = FLT_MAX + */
                    }
                    if (v < 4 && where == 1 && nsrc == 1) {
                        /* x1 is not read with one source. */
                        lstate_fini(&ls);
                        continue;
                    }
                    keep = fdup(lstate_cur(&ls)->v, N);
                    {
                        enum obd_codec_lazy_mode mk = lstate_cur(&ls)->mode;
                        float sk = lstate_cur(&ls)->scale;
                        int ck = ls.cur;

                        lsc = 42.0f;
                        ck_assert_int_eq(lstate_worker(im[k], &ls, src, nsrc,
                                                       count, lbits, &lsc),
                                         OBD_E_NONFINITE);
                        ck_assert(lsc == 42.0f);
                        /* The step wrote the other buffer only: the
                         * state it read needs no abort. */
                        ck_assert_int_eq(ls.cur, ck);
                        ck_assert_int_eq(lstate_cur(&ls)->mode, mk);
                        ck_assert(memcmp(&lstate_cur(&ls)->scale, &sk, 4) == 0);
                        ck_assert(memcmp(keep, lstate_cur(&ls)->v, N * 4) == 0);
                    }
                    free(keep);
                    if (v == 4) {
                        /* The state was edited by hand above; done. */
                        lstate_fini(&ls);
                        continue;
                    }
                    /* The failed step left no trace: a good step now
                     * equals the reference's. */
                    fill_unit(&r, x0, count, 1.0f);
                    fill_unit(&r, x1, count, 1.0f);
                    if (nsrc == 1)
                        ck_assert_int_eq(
                            codec_ref_compress(x0, count, e, N, bits, &sc), 0);
                    else
                        ck_assert_int_eq(codec_ref_compress_avg(
                                             src, 2, count, e, b, N, bits, &sc),
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
                                 OBD_E_NONFINITE);
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
                    memcpy(keep, ls.st[0].v, sizeof(keep));
                    sc = 42.0f;
                    ck_assert_int_eq(
                        lstate_server(im[k], &ls, in, scales, n, bits, &sc),
                        OBD_E_NONFINITE);
                    ck_assert(sc == 42.0f);
                    ck_assert_int_eq(ls.cur, 0);
                    ck_assert_int_eq(ls.st[0].mode, OBD_CODEC_LAZY_EAGER);
                    ck_assert(memcmp(keep, ls.st[0].v, sizeof(keep)) == 0);
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
            OBD_E_INVAL);
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 1, 1, &ok, nx, 0, bits, &sc),
            OBD_E_INVAL);
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 1, 1, &ok, nx, 12, bits, &sc),
            OBD_E_INVAL);
        ck_assert_int_eq(
            obd_codec_lazy_compress(im[k], src, 1, 17, &ok, nx, 16, bits, &sc),
            OBD_E_INVAL);
        ck_assert_int_eq(
            obd_codec_lazy_server(im[k], in, scales, 0, &ok, nx, 8, bits, &sc),
            OBD_E_INVAL);
        ck_assert_int_eq(
            obd_codec_lazy_server(im[k], in, scales, 1, &ok, nx, 12, bits, &sc),
            OBD_E_INVAL);
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, 1, 16, &bad[b],
                                                     nx, 16, bits, &sc),
                             OBD_E_INVAL);
            ck_assert_int_eq(obd_codec_lazy_server(im[k], in, scales, 1,
                                                   &bad[b], nx, 16, bits, &sc),
                             OBD_E_INVAL);
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

/* A state stepped in place (the daemon's) whose op fails: abort resets it
 * to ZERO, and the next step is exactly the reference's step from a zero
 * error. Once with a NaN in this node's step, once with a step that
 * succeeded here while another node failed the op. */
START_TEST(lazy_state_abort)
{
    struct rng r = {0xab047u};
    const struct obd_codec_impl *im[2];
    int ni = impls(im);
    const size_t count = 1000, N = 1000;

    for (int k = 0; k < ni; k++)
        for (int other = 0; other < 2; other++) {
            float *x = xmalloc(N * sizeof(float));
            float *e = xmalloc(N * sizeof(float));
            float *le = xmalloc(N * sizeof(float)), sc, lsc = 0.0f;
            uint8_t bits[125], lbits[125];
            const float *src[1] = {x};
            struct lstate ls;

            lstate_init(&ls, N, 1, 0);
            for (int step = 0; step < 3; step++) {
                fill_unit(&r, x, count, 1.0f);
                ck_assert_int_eq(
                    lstate_worker(im[k], &ls, src, 1, count, lbits, &lsc), 0);
            }
            /* The failing step: a NaN here, or (other) a good step here
             * while some other node failed the op. */
            fill_unit(&r, x, count, 1.0f);
            x[count / 2] = other ? x[count / 2] : NAN;
            {
                struct obd_codec_lazy p1 = lstate_prev(&ls);
                int want = other ? 0 : OBD_E_NONFINITE;
                ck_assert_int_eq(obd_codec_lazy_compress(im[k], src, 1, count,
                                                         &p1, lstate_next(&ls),
                                                         N, lbits, &lsc),
                                 want);
            }
            obd_codec_lazy_state_abort(lstate_cur(&ls));
            ck_assert_int_eq(lstate_cur(&ls)->mode, OBD_CODEC_LAZY_ZERO);
            /* The next step starts from a zero error. */
            fill_unit(&r, x, count, 1.0f);
            memset(e, 0, N * sizeof(float));
            ck_assert_int_eq(codec_ref_compress(x, count, e, N, bits, &sc), 0);
            ck_assert_int_eq(
                lstate_worker(im[k], &ls, src, 1, count, lbits, &lsc), 0);
            ck_assert(memcmp(&sc, &lsc, sizeof(float)) == 0);
            ck_assert(memcmp(bits, lbits, sizeof(bits)) == 0);
            lstate_error(im[k], &ls, le);
            ck_assert(memcmp(e, le, N * sizeof(float)) == 0);
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
    tcase_add_test(tc, dispatch);
    tcase_add_test(tc, worker_vs_reference);
    tcase_add_test(tc, worker_adversarial);
    tcase_add_test(tc, worker_nonfinite);
    tcase_add_test(tc, server_vs_reference);
    tcase_add_test(tc, server_rejects);
    tcase_add_test(tc, decompress_vs_reference);
    tcase_add_test(tc, avg_vs_reference);
    tcase_add_test(tc, avg_one_equals_compress);
    tcase_add_test(tc, avg_nonfinite);
    tcase_add_test(tc, tensors_equal_reference);
    tcase_add_test(tc, ranges_equal_reference);
    tcase_add_test(tc, worker_conservation);
    tcase_add_test(tc, server_conservation);
    tcase_add_test(tc, full_round_vs_reference);
    tcase_add_test(tc, lazy_worker_equals_reference);
    tcase_add_test(tc, lazy_server_equals_reference);
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
