/* What 1-bit Adam's own passes cost per step, against memcpy of the
 * parameters timed in the same run.
 *
 * usage: bench_adam [-n ELEMS] [-r REPEATS] [-t THREADS] [--json]
 *
 * A step of obcomm_adam_step is the optimizer's passes plus one collective
 * (an fp32 allreduce in the warm-up, the 1-bit allreduce after it). The
 * collective is the daemon's and is timed by bench_codec and
 * bench_allreduce; this program times the rest, the client's work, by
 * calling the passes of client/adam.c directly on ELEMS floats (default
 * 20,000,000): no daemon, no sockets, so nothing but the passes is in the
 * time. Rows:
 *
 *   memcpy                  memcpy of the parameters into another buffer
 *                           (the baseline: reads 4, writes 4 bytes per
 *                           element)
 *   before: warm-up step    the loops of adam.c before the fused passes,
 *                           copied here: the copy of the gradient into the
 *                           shared buffer, the m/v loop, the update loop
 *   before: compression step  the momentum loop, the mask loop (a call of
 *                           masked() per element) and the update loop
 *                           with its division
 *   IMPL: warm-up step, copy    obcomm_adam_start_ex's step: the copy of
 *                           the gradient into the shared buffer and the
 *                           fused warm-up pass
 *   IMPL: warm-up step, in place  obcomm_adam_start_inplace's step (what
 *                           OneBitAdam does for fp32): the fused pass alone
 *   IMPL: compression step  the momentum pass and the fused update pass
 *   IMPL: momentum pass, compression pass   those passes alone
 *   IMPL: bf16 compression, separate / fused   a compression step of a
 *                           bf16 model over fp32 masters, the conversions
 *                           as scalar passes of their own (as before) or
 *                           inside the passes (mixed_step)
 * for IMPL portable and avx2 (when the CPU has it); with -t THREADS > 1
 * also "avx2 xT": the same passes run by obc_adam_run on THREADS threads,
 * as obcomm_adam_set_threads(THREADS) runs them.
 *
 * The state is that of the compression stage: 1% of coordinates masked
 * (the automatic mask's share is about that on real models), bias
 * correction on, weight decay 0.01. REPEATS rounds; each round times every
 * row once, back to back, so load from other processes hits the baseline
 * and the rows alike. ms is the median over rounds; ratio is the median
 * over rounds of row time / memcpy time of the same round, and min_ratio
 * the smallest of those (what a quiet round shows on a shared machine; a
 * result quotes the median). All buffers
 * are 64-byte aligned and touched before timing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adam_kernels.h"
#include "half.h"
#include "bench_util.h"

#define MAX_THREADS 64

static float *xalloc(size_t n)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);

    if (p == NULL) {
        fprintf(stderr, "bench_adam: out of memory (%zu floats)\n", n);
        exit(2);
    }
    return p;
}

/* The optimizer's state as client/adam.c keeps it. */
struct opt {
    size_t count;
    long step, freeze_step;
    float lr, beta1, beta2, eps, weight_decay;
    int bias_correction;
    int auto_on;
    float auto_thr;
    uint8_t *keep;
    float *m, *g, *v, *d;
};

/* ---- before: the loops of client/adam.c before the fused passes ---- */

static int masked(const struct opt *a, size_t i)
{
    if (a->keep)
        return a->keep[i] == 0;
    return a->auto_on && a->v[i] <= a->auto_thr;
}

static void old_update(struct opt *a, float *p)
{
    float mc = 1.0f, vc = 1.0f;
    if (a->bias_correction) {
        long tv = a->step < a->freeze_step ? a->step + 1 : a->freeze_step;
        mc = 1.0f / (1.0f - powf(a->beta1, (float)(a->step + 1)));
        vc = tv > 0 ? 1.0f / (1.0f - powf(a->beta2, (float)tv)) : 1.0f;
    }
    const float *m = a->m, *v = a->v;
    for (size_t i = 0; i < a->count; i++) {
        float u = (m[i] * mc) / (sqrtf(v[i] * vc) + a->eps);
        u += a->weight_decay * p[i];
        p[i] -= a->lr * u;
    }
}

static void old_warmup_step(struct opt *a, float *p, const float *grads)
{
    float b1 = a->beta1, b2 = a->beta2;
    memcpy(a->g, grads, a->count * sizeof(float));
    for (size_t i = 0; i < a->count; i++) {
        float g = a->g[i];
        a->m[i] = b1 * a->m[i] + (1.0f - b1) * g;
        a->v[i] = b2 * a->v[i] + (1.0f - b2) * g * g;
    }
    old_update(a, p);
}

static void old_compression_step(struct opt *a, float *p, const float *grads)
{
    float b1 = a->beta1;
    for (size_t i = 0; i < a->count; i++)
        a->g[i] = b1 * a->m[i] + (1.0f - b1) * grads[i];
    float *m = a->g;
    a->g = a->m;
    a->m = m;
    if (a->keep || a->auto_on)
        for (size_t i = 0; i < a->count; i++)
            if (masked(a, i))
                a->m[i] = 0.0f;
    old_update(a, p);
}

/* ---- after: the passes of client/adam.c ---- */

static struct obc_adam_coef coef(const struct opt *a)
{
    struct obc_adam_coef c = {.lr = a->lr,
                              .beta1 = a->beta1,
                              .beta2 = a->beta2,
                              .eps = a->eps,
                              .weight_decay = a->weight_decay,
                              .mc = 1.0f,
                              .vc = 1.0f,
                              .gscale = 1.0f};
    if (a->bias_correction) {
        long tv = a->step < a->freeze_step ? a->step + 1 : a->freeze_step;
        c.mc = 1.0f / (1.0f - powf(a->beta1, (float)(a->step + 1)));
        c.vc = tv > 0 ? 1.0f / (1.0f - powf(a->beta2, (float)tv)) : 1.0f;
    }
    return c;
}

/* A pass as client/adam.c runs it: obc_adam_run on `threads` threads. */
enum pass { PASS_WARMUP, PASS_MOMENTUM, PASS_COMPRESS };

static void pass(const struct obc_adam_kernels *k, int threads, enum pass ps,
                 struct opt *a, float *p, const float *grads)
{
    struct obc_adam_pass run = {.n = a->count, .m = a->m, .p = p, .k = coef(a)};

    switch (ps) {
    case PASS_WARMUP:
        run.kind = OBC_ADAM_WARMUP;
        run.g = a->g;
        run.v = a->v;
        break;
    case PASS_MOMENTUM:
        run.kind = OBC_ADAM_MOMENTUM;
        run.g = grads;
        run.next = a->g;
        break;
    case PASS_COMPRESS:
        run.kind = OBC_ADAM_COMPRESS;
        run.d = a->d;
        break;
    }
    if (obc_adam_run(k, &run, threads) != threads && threads > 1) {
        fprintf(stderr, "bench_adam: a pass ran on fewer threads than %d\n",
                threads);
        exit(2);
    }
}

static void new_warmup_step(const struct obc_adam_kernels *k, int threads,
                            struct opt *a, float *p, const float *grads)
{
    memcpy(a->g, grads, a->count * sizeof(float));
    pass(k, threads, PASS_WARMUP, a, p, grads);
}

static void new_compression_step(const struct obc_adam_kernels *k, int threads,
                                 struct opt *a, float *p, const float *grads)
{
    pass(k, threads, PASS_MOMENTUM, a, p, grads);
    float *m = a->g;
    a->g = a->m;
    a->m = m;
    pass(k, threads, PASS_COMPRESS, a, p, grads);
}

/* ---- the rows ---- */

enum what {
    W_MEMCPY,
    W_OLD_WARMUP,
    W_OLD_COMPRESSION,
    W_WARMUP,
    W_COMPRESSION,
    W_PASS_WARMUP,
    W_PASS_MOMENTUM,
    W_PASS_COMPRESS,
    W_MIXED_SEPARATE,
    W_MIXED_FUSED,
};

struct row {
    char name[64];
    enum what what;
    const struct obc_adam_kernels *k;
    int threads;
    double *ms, *ratio;
};

struct bench {
    struct opt a;
    float *p, *grads, *dst;
    uint16_t *g16, *model16; /* bf16 gradients and model */
};

/* A compression step of a bf16 model over fp32 masters. Separate: the
 * passes as adam.c made them before the conversions were fused (the
 * gradient widened into the shared buffer by a scalar loop, the momentum
 * pass, the update pass, the model rounded by a scalar loop). Fused: the
 * momentum pass widening the gradient block by block, and the update
 * pass writing the rounded model block by block (obc_adam_run). */
static void mixed_step(const struct obc_adam_kernels *k, int threads,
                       struct bench *b, int fused)
{
    struct opt *a = &b->a;
    struct obc_adam_coef c = coef(a);

    if (!fused) {
        for (size_t i = 0; i < a->count; i++)
            a->g[i] = obcomm_bf16_to_f32(b->g16[i]);
        pass(k, threads, PASS_MOMENTUM, a, b->p, a->g);
    } else {
        struct obc_adam_pass ps = {.kind = OBC_ADAM_MOMENTUM,
                                   .n = a->count,
                                   .g16 = b->g16,
                                   .bf16 = 1,
                                   .m = a->m,
                                   .next = a->g,
                                   .k = c};
        obc_adam_run(k, &ps, threads);
    }
    float *m = a->g;
    a->g = a->m;
    a->m = m;
    if (!fused) {
        pass(k, threads, PASS_COMPRESS, a, b->p, NULL);
        for (size_t i = 0; i < a->count; i++)
            b->model16[i] = obcomm_f32_to_bf16(b->p[i]);
    } else {
        struct obc_adam_pass ps = {.kind = OBC_ADAM_COMPRESS,
                                   .n = a->count,
                                   .m = a->m,
                                   .d = a->d,
                                   .p = b->p,
                                   .model16 = b->model16,
                                   .bf16 = 1,
                                   .k = c};
        obc_adam_run(k, &ps, threads);
    }
}

static void run_row(struct bench *b, const struct row *r)
{
    struct opt *a = &b->a;

    /* Each row runs in the stage it times, with the step counter there. */
    switch (r->what) {
    case W_MEMCPY:
        memcpy(b->dst, b->p, a->count * sizeof(float));
        break;
    case W_OLD_WARMUP:
        a->step = 0;
        old_warmup_step(a, b->p, b->grads);
        break;
    case W_OLD_COMPRESSION:
        a->step = a->freeze_step;
        old_compression_step(a, b->p, b->grads);
        break;
    case W_WARMUP:
        a->step = 0;
        new_warmup_step(r->k, r->threads, a, b->p, b->grads);
        break;
    case W_COMPRESSION:
        a->step = a->freeze_step;
        new_compression_step(r->k, r->threads, a, b->p, b->grads);
        break;
    case W_PASS_WARMUP:
        a->step = 0;
        pass(r->k, r->threads, PASS_WARMUP, a, b->p, b->grads);
        break;
    case W_PASS_MOMENTUM:
        a->step = a->freeze_step;
        pass(r->k, r->threads, PASS_MOMENTUM, a, b->p, b->grads);
        break;
    case W_PASS_COMPRESS:
        a->step = a->freeze_step;
        pass(r->k, r->threads, PASS_COMPRESS, a, b->p, b->grads);
        break;
    case W_MIXED_SEPARATE:
    case W_MIXED_FUSED:
        a->step = a->freeze_step;
        mixed_step(r->k, r->threads, b, r->what == W_MIXED_FUSED);
        break;
    }
}

static double minimum(const double *x, int n)
{
    double m = x[0];
    for (int i = 1; i < n; i++)
        m = x[i] < m ? x[i] : m;
    return m;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: bench_adam [-n ELEMS] [-r REPEATS] [-t THREADS] [--json]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    size_t n = 20000000;
    int repeats = 11, threads = 1, json = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else
            usage();
    }
    if (n == 0 || repeats < 1 || threads < 1 || threads > MAX_THREADS)
        usage();

    struct bench b = {0};
    struct opt *a = &b.a;
    *a = (struct opt){.count = n,
                      .freeze_step = 100,
                      .lr = 1e-3f,
                      .beta1 = 0.9f,
                      .beta2 = 0.999f,
                      .eps = 1e-8f,
                      .weight_decay = 0.01f,
                      .bias_correction = 1,
                      .auto_on = 1};
    a->m = xalloc(n);
    a->g = xalloc(n);
    a->v = xalloc(n);
    a->d = xalloc(n);
    b.p = xalloc(n);
    b.grads = xalloc(n);
    b.dst = xalloc(n);
    b.g16 = malloc(n * sizeof(uint16_t));
    b.model16 = malloc(n * sizeof(uint16_t));
    if (b.g16 == NULL || b.model16 == NULL) {
        fprintf(stderr, "bench_adam: out of memory\n");
        return 2;
    }
    uint64_t s = 12345;
    double vsum = 0;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        float x = (float)(s >> 40) / 16777216.0f - 0.5f;
        b.p[i] = x;
        b.grads[i] = 0.01f * x;
        b.g16[i] = obcomm_f32_to_bf16(0.01f * x);
        b.model16[i] = 0;
        a->m[i] = 0.001f * x;
        /* 1% of v tiny: the automatic mask's share. */
        a->v[i] = (s >> 20) % 100 == 0 ? 1e-12f : 1e-4f * (1.0f + x);
        a->g[i] = 0.0f;
        b.dst[i] = 0.0f;
        vsum += (double)a->v[i];
    }
    double r = 0.01 * sqrt(vsum / (double)n);
    a->auto_thr = (float)(r * r);
    struct obc_adam_coef fc = coef(&(struct opt){.step = a->freeze_step,
                                                 .freeze_step = a->freeze_step,
                                                 .beta1 = a->beta1,
                                                 .beta2 = a->beta2,
                                                 .bias_correction = 1});
    size_t nmasked = 0;
    for (size_t i = 0; i < n; i++) {
        int mk = masked(a, i);
        nmasked += (size_t)mk;
        a->d[i] =
            mk ? OBC_ADAM_MASKED : obc_adam_factor(a->v[i], fc.vc, a->eps);
    }

    const struct obc_adam_kernels *impls[2] = {obc_adam_kernels_portable(),
                                               obc_adam_kernels_avx2()};
    struct row rows[32];
    int nrows = 0;
#define ROW(W, K, T, NAME)                                                  \
    do {                                                                    \
        rows[nrows] = (struct row){.what = (W), .k = (K), .threads = (T)};  \
        snprintf(rows[nrows].name, sizeof(rows[nrows].name), "%s", (NAME)); \
        nrows++;                                                            \
    } while (0)
    ROW(W_MEMCPY, NULL, 1, "memcpy");
    ROW(W_OLD_WARMUP, NULL, 1, "before: warm-up step");
    ROW(W_OLD_COMPRESSION, NULL, 1, "before: compression step");
    for (int j = 0; j < 2; j++) {
        int tcount = j == 1 && threads > 1 ? 2 : 1;
        for (int tt = 0; tt < tcount; tt++) {
            const struct obc_adam_kernels *k = impls[j];
            if (k == NULL)
                continue;
            int t = tt ? threads : 1;
            char nm[64], tag[24];
            snprintf(tag, sizeof(tag), t > 1 ? "%s x%d" : "%s", k->name, t);
            static const struct {
                enum what w;
                const char *s;
            } kinds[] = {{W_WARMUP, "warm-up step, copy"},
                         {W_PASS_WARMUP, "warm-up step, in place"},
                         {W_COMPRESSION, "compression step"},
                         {W_PASS_MOMENTUM, "momentum pass"},
                         {W_PASS_COMPRESS, "compression pass"},
                         {W_MIXED_SEPARATE, "bf16 compression, separate"},
                         {W_MIXED_FUSED, "bf16 compression, fused"}};
            for (size_t q = 0; q < sizeof(kinds) / sizeof(kinds[0]); q++) {
                snprintf(nm, sizeof(nm), "%s: %s", tag, kinds[q].s);
                ROW(kinds[q].w, k, t, nm);
            }
        }
    }
#undef ROW
    for (int i = 0; i < nrows; i++) {
        rows[i].ms = calloc((size_t)repeats, sizeof(double));
        rows[i].ratio = calloc((size_t)repeats, sizeof(double));
        if (rows[i].ms == NULL || rows[i].ratio == NULL)
            return 2;
    }

    /* One untimed round: pages faulted in, caches and CPU warmed. */
    for (int i = 0; i < nrows; i++)
        run_row(&b, &rows[i]);
    for (int rep = 0; rep < repeats; rep++) {
        for (int i = 0; i < nrows; i++) {
            double t0 = bench_now_ms();
            run_row(&b, &rows[i]);
            rows[i].ms[rep] = bench_now_ms() - t0;
        }
        for (int i = 0; i < nrows; i++)
            rows[i].ratio[rep] = rows[i].ms[rep] / rows[0].ms[rep];
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(b.p[i])) {
            fprintf(stderr, "bench_adam: parameter %zu not finite\n", i);
            return 1;
        }

    if (json)
        printf("{\"elems\": %zu, \"repeats\": %d, \"threads\": %d, "
               "\"masked\": %zu, \"rows\": [",
               n, repeats, threads, nmasked);
    else
        printf("bench_adam: %zu floats (%.1f MB per array), %d rounds, %zu "
               "masked\n%-36s %10s %8s %9s\n",
               n, (double)n * 4 / 1e6, repeats, nmasked, "row", "ms", "ratio",
               "min_ratio");
    for (int i = 0; i < nrows; i++) {
        double rmin = minimum(rows[i].ratio, repeats);
        double ms = median(rows[i].ms, repeats);
        double ratio = median(rows[i].ratio, repeats);
        if (json)
            printf("%s{\"name\": \"%s\", \"ms\": %.3f, \"ratio_memcpy\": "
                   "%.3f, \"min_ratio\": %.3f}",
                   i ? ", " : "", rows[i].name, ms, ratio, rmin);
        else
            printf("%-36s %10.2f %8.2f %9.2f\n", rows[i].name, ms, ratio, rmin);
        free(rows[i].ms);
        free(rows[i].ratio);
    }
    if (json)
        printf("]}\n");
    free(a->m);
    free(a->g);
    free(a->v);
    free(a->d);
    free(b.p);
    free(b.grads);
    free(b.dst);
    free(b.g16);
    free(b.model16);
    return 0;
}
