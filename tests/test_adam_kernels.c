/* The passes of 1-bit Adam (client/adam_kernels.h) against a plain scalar
 * reference written from the header, bit for bit: the portable table and,
 * when the CPU has it, the AVX2 table.
 *
 * Each case is a whole run of one optimizer over n elements: warm-up
 * steps on a random averaged gradient, then at the freeze the factor array
 * built from the frozen v with a mask, then compression steps (the
 * momentum pass, a stand-in for the 1-bit average that is the same for
 * every implementation, the update pass). Every implementation runs on
 * its own copy of the state; after every pass m, v, p and the built
 * momentum must equal the reference's byte for byte. The cases cross
 * lengths around the vector width (tails), unaligned arrays, masks (none,
 * all, random, sparse, by a threshold on v as the automatic mask),
 * weight decay 0 and not, bias correction off and on, a learning rate
 * that changes every step, exact and negative zeros in the data, and
 * denominators that overflow to infinity (a factor of +0.0 that is not
 * the mask). */
#include <check.h>

#include "ck_run.h"
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam_kernels.h"
#include "half.h"

/* splitmix64: a fixed seed per case, so a failure replays. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), with one value in 16 an exact zero of either sign
 * and a spread of magnitudes (times 2^-20 .. 2^4). */
static float rnd(uint64_t *s)
{
    uint64_t r = next_u64(s);
    if ((r & 15) == 0)
        return (r & 16) ? -0.0f : 0.0f;
    float x = (float)((r >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    return ldexpf(x, (int)((r >> 8) % 25) - 20);
}

/* The reference, written from adam_kernels.h. */
static void ref_warmup(size_t n, const float *g, float *m, float *v, float *p,
                       const struct obc_adam_coef *k)
{
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * k->gscale;
        m[i] = k->beta1 * m[i] + (1.0f - k->beta1) * gi;
        v[i] = k->beta2 * v[i] + ((1.0f - k->beta2) * gi) * gi;
        float den = sqrtf(v[i] * k->vc) + k->eps;
        float u = (m[i] * k->mc) / den + k->weight_decay * p[i];
        p[i] = p[i] - k->lr * u;
    }
}

static void ref_momentum(size_t n, const float *m, const float *grad,
                         float *next, float b1, float gscale)
{
    for (size_t i = 0; i < n; i++)
        next[i] = b1 * m[i] + (1.0f - b1) * (grad[i] * gscale);
}

static void ref_compress(size_t n, float *m, const float *d, float *p,
                         const struct obc_adam_coef *k)
{
    for (size_t i = 0; i < n; i++) {
        int masked = signbit(d[i]) != 0;
        if (masked)
            m[i] = 0.0f;
        float um = masked ? 0.0f : (m[i] * k->mc) * d[i];
        float u = um + k->weight_decay * p[i];
        p[i] = p[i] - k->lr * u;
    }
}

static const struct obc_adam_kernels reference = {
    .name = "reference",
    .warmup = ref_warmup,
    .momentum = ref_momentum,
    .compress = ref_compress,
};

enum mask_kind {
    MASK_NONE,
    MASK_ALL,
    MASK_RANDOM,    /* about one in three */
    MASK_SPARSE,    /* about one in a hundred */
    MASK_THRESHOLD, /* v <= a threshold, as the automatic mask */
    NMASKS
};

struct run_case {
    size_t n;
    int misalign; /* arrays start 1 float past a 32-byte boundary */
    enum mask_kind mask;
    float weight_decay;
    int bias_correction;
    int overflow; /* some v so large that sqrt(v*vc) is infinite */
    uint64_t seed;
};

/* One implementation's state: the optimizer's m, v, factors and the
 * momentum buffer, and the parameters. */
struct state {
    float *mem[5];
    float *m, *v, *d, *next, *p;
};

static void state_init(struct state *s, size_t n, int misalign)
{
    for (int j = 0; j < 5; j++) {
        s->mem[j] = aligned_alloc(32, ((n + 1) * sizeof(float) + 31) / 32 * 32);
        ck_assert_ptr_nonnull(s->mem[j]);
        memset(s->mem[j], 0, (n + 1) * sizeof(float));
    }
    s->m = s->mem[0] + misalign;
    s->v = s->mem[1] + misalign;
    s->d = s->mem[2] + misalign;
    s->next = s->mem[3] + misalign;
    s->p = s->mem[4] + misalign;
}

static void state_fini(struct state *s)
{
    for (int j = 0; j < 5; j++)
        free(s->mem[j]);
}

/* Equal bytes, or the first difference named. */
static void check_same(const char *impl, const char *what, int step,
                       const float *got, const float *want, size_t n)
{
    if (n == 0 || memcmp(got, want, n * sizeof(float)) == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a != b)
            ck_abort_msg("%s: %s[%zu] after step %d is %a (0x%08x), the "
                         "reference has %a (0x%08x)",
                         impl, what, i, step, (double)got[i], a,
                         (double)want[i], b);
    }
}

#define FREEZE 6
#define STEPS  16

/* The mask of the case over the frozen v (the reference's copy). */
static int masked_at(const struct run_case *rc, const float *v, size_t i,
                     float thr, uint64_t *s)
{
    switch (rc->mask) {
    case MASK_NONE:
        return 0;
    case MASK_ALL:
        return 1;
    case MASK_RANDOM:
        return next_u64(s) % 3 == 0;
    case MASK_SPARSE:
        return next_u64(s) % 100 == 0;
    default:
        return v[i] <= thr;
    }
}

static void run(const struct run_case *rc)
{
    const struct obc_adam_kernels *impls[3] = {
        &reference, obc_adam_kernels_portable(), obc_adam_kernels_avx2()};
    int nimpl = impls[2] != NULL ? 3 : 2;
    size_t n = rc->n;
    struct state st[3];
    float *g = malloc((n + 1) * sizeof(float));
    float *grad = malloc((n + 1) * sizeof(float));
    ck_assert(g != NULL && grad != NULL);
    uint64_t seed = rc->seed;

    for (int j = 0; j < nimpl; j++)
        state_init(&st[j], n, rc->misalign);
    for (size_t i = 0; i < n; i++) {
        float p0 = rnd(&seed);
        for (int j = 0; j < nimpl; j++)
            st[j].p[i] = p0;
    }

    const float beta1 = 0.9f, beta2 = 0.999f;
    for (int t = 0; t < STEPS; t++) {
        struct obc_adam_coef k = {.lr = 1e-3f * (1.0f + 0.37f * (float)t),
                                  .beta1 = beta1,
                                  .beta2 = beta2,
                                  .eps = 1e-8f,
                                  .weight_decay = rc->weight_decay,
                                  .mc = 1.0f,
                                  .vc = 1.0f,
                                  .gscale = t % 3 == 1 ? 0.37f : 1.0f};
        if (rc->bias_correction) {
            long tv = t < FREEZE ? t + 1 : FREEZE;
            k.mc = 1.0f / (1.0f - powf(beta1, (float)(t + 1)));
            k.vc = 1.0f / (1.0f - powf(beta2, (float)tv));
        }
        if (t < FREEZE) {
            for (size_t i = 0; i < n; i++)
                g[i] = rnd(&seed);
            for (int j = 0; j < nimpl; j++) {
                impls[j]->warmup(n, g, st[j].m, st[j].v, st[j].p, &k);
                check_same(impls[j]->name, "m", t, st[j].m, st[0].m, n);
                check_same(impls[j]->name, "v", t, st[j].v, st[0].v, n);
                check_same(impls[j]->name, "p", t, st[j].p, st[0].p, n);
            }
            continue;
        }
        if (t == FREEZE) {
            /* The frozen v: overflowing coordinates first, then the mask
             * and the factors, the same for every implementation. */
            if (rc->overflow)
                for (size_t i = 3; i < n; i += 7)
                    for (int j = 0; j < nimpl; j++)
                        st[j].v[i] = FLT_MAX;
            double sum = 0;
            for (size_t i = 0; i < n; i++)
                sum += (double)st[0].v[i];
            float thr = n ? (float)(0.3 * sum / (double)n) : 0.0f;
            uint64_t ms = rc->seed ^ 0x5eed;
            for (size_t i = 0; i < n; i++) {
                int mk = masked_at(rc, st[0].v, i, thr, &ms);
                float want = 1.0f / (sqrtf(st[0].v[i] * k.vc) + k.eps);
                ck_assert(!rc->overflow || i % 7 != 3 || k.vc == 1.0f ||
                          want == 0.0f);
                st[0].d[i] = mk ? -0.0f : want;
                for (int j = 1; j < nimpl; j++)
                    st[j].d[i] = mk ? OBC_ADAM_MASKED
                                    : obc_adam_factor(st[j].v[i], k.vc, k.eps);
            }
            for (int j = 1; j < nimpl; j++)
                check_same(impls[j]->name, "d", t, st[j].d, st[0].d, n);
        }
        for (size_t i = 0; i < n; i++)
            grad[i] = rnd(&seed);
        for (int j = 0; j < nimpl; j++) {
            impls[j]->momentum(n, st[j].m, grad, st[j].next, beta1, k.gscale);
            check_same(impls[j]->name, "next", t, st[j].next, st[0].next, n);
        }
        for (int j = 0; j < nimpl; j++) {
            /* The 1-bit average's stand-in: the momentum, halved in every
             * other coordinate; then it becomes m (adam.c swaps them). */
            for (size_t i = 0; i < n; i += 2)
                st[j].next[i] *= 0.5f;
            float *sw = st[j].m;
            st[j].m = st[j].next;
            st[j].next = sw;
            impls[j]->compress(n, st[j].m, st[j].d, st[j].p, &k);
            check_same(impls[j]->name, "m", t, st[j].m, st[0].m, n);
            check_same(impls[j]->name, "p", t, st[j].p, st[0].p, n);
        }
    }
    /* The run moved the parameters and stayed finite (no NaN hides a
     * difference: NaN payloads would compare by bytes anyway). */
    for (size_t i = 0; i < n; i++)
        ck_assert(isfinite(st[0].p[i]));
    for (int j = 0; j < nimpl; j++)
        state_fini(&st[j]);
    free(g);
    free(grad);
}

static const size_t lengths[] = {0,  1,  2,  7,  8,   9,    15,  16,
                                 17, 31, 33, 64, 101, 1001, 4099};
#define NLEN (sizeof(lengths) / sizeof(lengths[0]))

/* Every length, mask, weight decay and bias correction, aligned and not;
 * the loop index picks the mask and the flags. */
START_TEST(kernels_match_reference)
{
    int i = _i;
    struct run_case rc = {.mask = (enum mask_kind)(i % NMASKS),
                          .weight_decay = (i / NMASKS) % 2 ? 0.01f : 0.0f,
                          .bias_correction = (i / (2 * NMASKS)) % 2,
                          .misalign = (i / (4 * NMASKS)) % 2,
                          .seed = 1000 + (uint64_t)i};
    for (size_t l = 0; l < NLEN; l++) {
        rc.n = lengths[l];
        rc.seed = rc.seed * 31 + l;
        run(&rc);
    }
}
END_TEST

/* Denominators that overflow: with vc > 1, sqrt(FLT_MAX * vc) is +inf and
 * the factor is +0.0, which must not be taken for the mask (the momentum
 * stays, the update from it is +-0). */
START_TEST(overflowing_denominator_is_not_masked)
{
    for (int mask = 0; mask < NMASKS; mask++) {
        struct run_case rc = {.n = 1001,
                              .mask = (enum mask_kind)mask,
                              .weight_decay = 0.01f,
                              .bias_correction = 1,
                              .overflow = 1,
                              .seed = 77 + (uint64_t)mask};
        run(&rc);
    }
    /* And directly: the factor is +0.0, the momentum is kept. */
    float m[9], d[9], p[9];
    struct obc_adam_coef k = {
        .lr = 0.1f, .weight_decay = 0.0f, .mc = 1.0f, .gscale = 1.0f};
    for (int i = 0; i < 9; i++) {
        m[i] = 1.5f;
        p[i] = 2.0f;
        d[i] = obc_adam_factor(FLT_MAX, 2.0f, 1e-8f);
    }
    ck_assert(d[0] == 0.0f && !signbit(d[0]));
    const struct obc_adam_kernels *impls[2] = {obc_adam_kernels_portable(),
                                               obc_adam_kernels_avx2()};
    for (int j = 0; j < 2 && impls[j] != NULL; j++) {
        impls[j]->compress(9, m, d, p, &k);
        for (int i = 0; i < 9; i++) {
            ck_assert(m[i] == 1.5f);
            ck_assert(p[i] == 2.0f);
        }
    }
}
END_TEST

/* obc_adam_run split over 1..5 threads equals one call of the kernel
 * over the whole tensor, bit for bit, for every pass and a length that
 * leaves a ragged last range; and a tensor too short to split runs on the
 * calling thread alone. */
START_TEST(split_runs_match_one_call)
{
    const size_t n = 4 * OBC_ADAM_SPLIT_MIN + 37;
    const struct obc_adam_kernels *kern = obc_adam_kernels_best();
    float *base[6], *mem[6];
    uint64_t seed = 4242;
    for (int j = 0; j < 6; j++) {
        base[j] = malloc(n * sizeof(float));
        mem[j] = malloc(n * sizeof(float));
        ck_assert(base[j] != NULL && mem[j] != NULL);
        for (size_t i = 0; i < n; i++)
            base[j][i] = j == 3 ? fabsf(rnd(&seed)) : rnd(&seed);
    }
    for (size_t i = 0; i < n; i += 5)
        base[3][i] = OBC_ADAM_MASKED; /* d: some masked */
    struct obc_adam_coef k = {.lr = 1e-3f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .eps = 1e-8f,
                              .weight_decay = 0.01f,
                              .mc = 1.1f,
                              .vc = 1.3f,
                              .gscale = 0.5f};
    for (int kind = OBC_ADAM_WARMUP; kind <= OBC_ADAM_COMPRESS; kind++) {
        float *want[6];
        for (int j = 0; j < 6; j++) {
            want[j] = malloc(n * sizeof(float));
            ck_assert_ptr_nonnull(want[j]);
            memcpy(want[j], base[j], n * sizeof(float));
        }
        /* g, m, v, d, p, next */
        if (kind == OBC_ADAM_WARMUP)
            kern->warmup(n, want[0], want[1], want[2], want[4], &k);
        else if (kind == OBC_ADAM_MOMENTUM)
            kern->momentum(n, want[1], want[0], want[5], k.beta1, k.gscale);
        else
            kern->compress(n, want[1], want[3], want[4], &k);
        for (int threads = 1; threads <= 5; threads++) {
            for (int j = 0; j < 6; j++)
                memcpy(mem[j], base[j], n * sizeof(float));
            struct obc_adam_pass ps = {.kind = kind,
                                       .n = n,
                                       .g = mem[0],
                                       .m = mem[1],
                                       .v = mem[2],
                                       .d = mem[3],
                                       .p = mem[4],
                                       .next = mem[5],
                                       .k = k};
            int used = obc_adam_run(kern, &ps, threads);
            ck_assert_int_eq(used, threads < 4 ? threads : 4);
            for (int j = 0; j < 6; j++)
                ck_assert_msg(memcmp(mem[j], want[j], n * sizeof(float)) == 0,
                              "pass %d on %d threads: array %d differs", kind,
                              threads, j);
        }
        for (int j = 0; j < 6; j++)
            free(want[j]);
    }
    struct obc_adam_pass small = {.kind = OBC_ADAM_MOMENTUM,
                                  .n = 2 * OBC_ADAM_SPLIT_MIN - 1,
                                  .g = mem[0],
                                  .m = mem[1],
                                  .next = mem[5],
                                  .k = k};
    ck_assert_int_eq(obc_adam_run(kern, &small, 4), 1);
    for (int j = 0; j < 6; j++) {
        free(base[j]);
        free(mem[j]);
    }
}
END_TEST

/* widen and narrow against proto/half.h, element by element, in both
 * tables: every one of the 65536 fp16 and bf16 patterns widened (scale 1
 * and 0.37), and for narrowing the floats where rounding is decided
 * (ties, the edges of the fp16 range and of its subnormals, Inf, NaNs
 * with payloads, signalling NaNs) plus a million random bit patterns. */
static void check_conversions(const struct obc_adam_kernels *kern)
{
    enum { N = 65536 + 3 };
    uint16_t *h = malloc(N * sizeof(uint16_t));
    float *f = malloc(N * sizeof(float));
    ck_assert(h != NULL && f != NULL);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int sc = 0; sc < 2; sc++) {
            float scale = sc ? 0.37f : 1.0f;
            for (size_t i = 0; i < N; i++)
                h[i] = (uint16_t)(i * 40503u); /* every pattern, shuffled */
            kern->widen(N, h, bf16, scale, f);
            for (size_t i = 0; i < N; i++) {
                float x =
                    bf16 ? obcomm_bf16_to_f32(h[i]) : obcomm_f16_to_f32(h[i]);
                float want = x * scale;
                /* ck_assert per element would cost a pipe write each */
                if (memcmp(&want, &f[i], 4) != 0)
                    ck_abort_msg("%s widen %s 0x%04x x %g: 0x%08x, want 0x%08x",
                                 kern->name, bf16 ? "bf16" : "fp16", h[i],
                                 (double)scale, obcomm_f32_bits(f[i]),
                                 obcomm_f32_bits(want));
            }
        }
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
        0x7f800001, 0xff800001, 0x7fa00000, 0x7fbfffff, 0x7fffffff, 0x7f812345,
        0x00000001, 0x807fffff, 0x477fe000, 0x477fefff, 0x477ff000, 0x477fffff,
        0x47800000, 0x38800000, 0x387fffff, 0x33000000, 0x33000001, 0x32ffffff,
        0x33800000, 0x33c00000, 0x34200000, 0x3f801000, 0x3f803000, 0x3f808000,
        0x3f818000, 0x3f7fffff, 0x7f7fffff, 0x7f7f8000, 0xff7f8000, 0x3f800001,
        0x38000000, 0xb8ffe000, 0x3a000000, 0x39fff000};
    const size_t ns = sizeof(special) / sizeof(special[0]);
    const size_t nf = ns + 1000003;
    float *x = malloc(nf * sizeof(float));
    uint16_t *out = malloc(nf * sizeof(uint16_t));
    ck_assert(x != NULL && out != NULL);
    uint64_t seed = 99;
    for (size_t i = 0; i < nf; i++)
        x[i] = obcomm_f32_from_bits(i < ns ? special[i]
                                           : (uint32_t)next_u64(&seed));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        kern->narrow(nf, x, bf16, out);
        for (size_t i = 0; i < nf; i++) {
            uint16_t want =
                bf16 ? obcomm_f32_to_bf16(x[i]) : obcomm_f32_to_f16(x[i]);
            if (out[i] != want)
                ck_abort_msg("%s narrow %s 0x%08x: 0x%04x, want 0x%04x",
                             kern->name, bf16 ? "bf16" : "fp16",
                             obcomm_f32_bits(x[i]), out[i], want);
        }
    }
    free(x);
    free(out);
    free(h);
    free(f);
}

START_TEST(conversions_match_half_h)
{
    check_conversions(obc_adam_kernels_portable());
    if (obc_adam_kernels_avx2() != NULL)
        check_conversions(obc_adam_kernels_avx2());
}
END_TEST

/* Mixed precision's fused passes (a momentum from fp16/bf16 gradients,
 * a warm-up or compress pass that writes the narrowed model) equal the
 * separate passes bit for bit, on 1 and 3 threads. */
START_TEST(fused_mixed_passes_match_separate)
{
    const size_t n = 3 * OBC_ADAM_SPLIT_MIN + 4099;
    const struct obc_adam_kernels *kern = obc_adam_kernels_best();
    uint64_t seed = 777;
    float *g = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4),
          *d = malloc(n * 4), *p = malloc(n * 4), *next = malloc(n * 4);
    float *m2 = malloc(n * 4), *v2 = malloc(n * 4), *p2 = malloc(n * 4),
          *next2 = malloc(n * 4), *tmp = malloc(n * 4);
    uint16_t *g16 = malloc(n * 2), *mod = malloc(n * 2), *mod2 = malloc(n * 2);
    ck_assert(g && m && v && d && p && next && m2 && v2 && p2 && next2 && tmp &&
              g16 && mod && mod2);
    struct obc_adam_coef k = {.lr = 1e-2f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .eps = 1e-8f,
                              .weight_decay = 0.01f,
                              .mc = 1.0f,
                              .vc = 1.0f,
                              .gscale = 0.75f};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int threads = 1; threads <= 3; threads += 2) {
            for (size_t i = 0; i < n; i++) {
                g16[i] = bf16 ? obcomm_f32_to_bf16(rnd(&seed))
                              : obcomm_f32_to_f16(rnd(&seed));
                g[i] = rnd(&seed);
                m[i] = m2[i] = rnd(&seed);
                v[i] = v2[i] = fabsf(rnd(&seed));
                d[i] = i % 9 == 0 ? OBC_ADAM_MASKED : fabsf(rnd(&seed));
                p[i] = p2[i] = rnd(&seed);
            }
            /* Momentum from the 16-bit gradient. */
            struct obc_adam_pass ps = {.kind = OBC_ADAM_MOMENTUM,
                                       .n = n,
                                       .g16 = g16,
                                       .bf16 = bf16,
                                       .m = m,
                                       .next = next,
                                       .k = k};
            obc_adam_run(kern, &ps, threads);
            kern->widen(n, g16, bf16, 1.0f, tmp);
            kern->momentum(n, m2, tmp, next2, k.beta1, k.gscale);
            ck_assert(memcmp(next, next2, n * 4) == 0);
            /* Widen alone, with a scale. */
            ps = (struct obc_adam_pass){.kind = OBC_ADAM_WIDEN,
                                        .n = n,
                                        .g16 = g16,
                                        .bf16 = bf16,
                                        .next = next,
                                        .k = k};
            obc_adam_run(kern, &ps, threads);
            kern->widen(n, g16, bf16, k.gscale, next2);
            ck_assert(memcmp(next, next2, n * 4) == 0);
            /* Warm-up and compress writing the model. */
            for (int kind = OBC_ADAM_WARMUP; kind <= OBC_ADAM_COMPRESS;
                 kind += 2) {
                ps = (struct obc_adam_pass){.kind = kind,
                                            .n = n,
                                            .g = g,
                                            .d = d,
                                            .m = m,
                                            .v = v,
                                            .p = p,
                                            .model16 = mod,
                                            .bf16 = bf16,
                                            .k = k};
                obc_adam_run(kern, &ps, threads);
                if (kind == OBC_ADAM_WARMUP)
                    kern->warmup(n, g, m2, v2, p2, &k);
                else
                    kern->compress(n, m2, d, p2, &k);
                kern->narrow(n, p2, bf16, mod2);
                ck_assert(memcmp(p, p2, n * 4) == 0);
                ck_assert(memcmp(m, m2, n * 4) == 0);
                ck_assert(memcmp(v, v2, n * 4) == 0);
                ck_assert(memcmp(mod, mod2, n * 2) == 0);
            }
        }
    float *all[] = {g, m, v, d, p, next, m2, v2, p2, next2, tmp};
    for (size_t j = 0; j < sizeof(all) / sizeof(all[0]); j++)
        free(all[j]);
    free(g16);
    free(mod);
    free(mod2);
}
END_TEST

/* The dispatch: best is AVX2 exactly when the CPU has it. */
START_TEST(best_is_avx2_when_available)
{
    const struct obc_adam_kernels *b = obc_adam_kernels_best();
    ck_assert_ptr_nonnull(b);
    if (obc_adam_kernels_avx2() != NULL)
        ck_assert_str_eq(b->name, "avx2");
    else
        ck_assert_str_eq(b->name, "portable");
    ck_assert_str_eq(obc_adam_kernels_portable()->name, "portable");
    if (obc_adam_kernels_avx2() == NULL)
        fprintf(stderr, "adam_kernels: no AVX2 here; the portable table "
                        "alone was compared\n");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("adam_kernels");
    TCase *tc = tcase_create("adam_kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, kernels_match_reference, 0, 8 * NMASKS);
    tcase_add_test(tc, overflowing_denominator_is_not_masked);
    tcase_add_test(tc, best_is_avx2_when_available);
    tcase_add_test(tc, split_runs_match_one_call);
    tcase_add_test(tc, conversions_match_half_h);
    tcase_add_test(tc, fused_mixed_passes_match_separate);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
